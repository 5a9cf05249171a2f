"""The page at / in headless Chromium: it renders (the screenshot is not blank) and the page's own
script sends a request and shows the server's answer (asked for by the URL hash)."""
from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest
import torch
from matplotlib.image import imread

from lmforge.pipelines.embed import SentenceEncoder
from tests import requires
from tests.browser import Pipe, run_once

pytestmark = requires.chromium
RESULT = ("(() => { const r = document.getElementById('result'); "
          "return r.dataset.state === 'done' && r.textContent; })()")


def test_page_runs_an_embedding_request_and_shows_the_answer(server, model_dirs, tmp_path):
    text = "the quick dog sat near the river"
    # virtual time stops while the page's fetch is in flight, so the DOM is dumped after the answer came
    url = f"{server.url}/#route=embed&model=enc&text={text.replace(' ', '%20')}"
    dom = run_once(tmp_path / "profile", url, "--virtual-time-budget=15000", "--dump-dom")
    match = re.search(r'<pre id="result" data-state="(\w+)">(.*?)</pre>', dom, re.DOTALL)
    assert match and match.group(1) == "done", dom[-2000:]
    answer = json.loads(html.unescape(match.group(2)))
    expected = SentenceEncoder.from_dir(model_dirs["enc"]).encode([text])[0]
    assert (torch.tensor(answer["embeddings"][0]) - expected).abs().max() <= 1e-5


def test_page_streams_a_generation(server, tmp_path):
    # a streamed body does not hold virtual time: wait in real time over the DevTools pipe
    with Pipe(tmp_path / "profile") as browser:
        browser.open(f"{server.url}/#route=generate&model=gen&text=the%20cat")
        text = browser.wait_for(RESULT)
        status = browser.wait_for("document.getElementById('status').textContent")
    streamed, final = text.split("\n\n", 1)
    final = json.loads(final)
    assert status.startswith("200 POST /generate")
    assert final["finish_reason"] in ("stop", "length") and streamed == final["text"] and final["token_ids"]


def test_page_renders_not_blank(server, tmp_path):
    shot = tmp_path / "page.png"
    run_once(tmp_path / "profile", f"{server.url}/#route=predict&model=cls&text=the%20cat%20sat",
             "--virtual-time-budget=15000", "--window-size=1280,860", f"--screenshot={shot}")
    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (860, 1280)
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 50 and pixels.std() > 0.1  # text, panels, a header: not one flat colour
    panel = pixels[130:380, 612:1240]  # the answer panel shows the prediction's JSON
    assert panel.std() > 0.05


def test_page_shows_the_attention_view_which_runs_in_the_browser(server, tmp_path):
    frame = "document.getElementById('view').contentDocument"
    with Pipe(tmp_path / "profile") as browser:
        browser.open(f"{server.url}/#route=attention&model=enc&text=the%20red%20fox%20sat")
        assert "attention view below" in browser.wait_for(RESULT)
        browser.wait_for(f"{frame} && {frame}.readyState === 'complete' && !!{frame}.getElementById('tabs')")
        # the view as served drives each of its own controls (#selftest) without a script error
        browser.call("Page.navigate", {"url": "about:blank"})
        browser.call("Page.navigate", {"url": f"{server.url}/attention?model=gen&text=the%20red%20fox%20sat"
                                              "#selftest"})
        browser.wait_for("document.getElementById('selftest') && document.getElementById('selftest').dataset.done",
                         60)
        result = json.loads(browser.wait_for("document.getElementById('selftest').textContent"))
    assert result["errors"] == [] and len(result["steps"]) > 5


def test_the_offline_api_reference_lists_every_route_with_its_fields(server, tmp_path):
    dom = run_once(tmp_path / "profile", f"{server.url}/docs", "--virtual-time-budget=10000", "--dump-dom")
    assert 'data-state="done"' in dom, dom[-2000:]
    for route in ("/v1/embeddings", "/embed", "/predict", "/fill_mask", "/generate", "/v1/completions",
                  "/attention", "/tokenize", "/health", "/info", "/v1/models", "/metrics"):
        assert f'<span class="path">{route}</span>' in dom, route
    assert "Query parameters" in dom and ">text_pair<" in dom and ">encoding_format<" in dom
