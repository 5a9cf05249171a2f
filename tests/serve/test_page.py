"""The page at / in headless Chromium: it renders (the screenshot is not blank) and the page's own
script sends a request and shows the server's answer (asked for by the URL hash): embeddings with their
options, features (tokens, offsets, shape), reranking (order, scores, truncation per document), each
route and model offered by its capability, and refusals shown with the field or limit they name."""
from __future__ import annotations

import base64
import html
import io
import json
import re
from urllib.parse import quote

import numpy as np
import pytest
import torch
from matplotlib.image import imread

import lmforge
from lmforge.pipelines.embed import SentenceEncoder
from tests import requires
from tests.browser import Pipe

pytestmark = requires.chromium
RESULT = ("(() => { const r = document.getElementById('result'); "
          "return r.dataset.state === 'done' && r.textContent; })()")
ANSWERED = ("(() => { const s = document.getElementById('result').dataset.state; "
            "return (s === 'done' || s === 'error') && s; })()")
QUERY = "the small cat sat on the mat"
LONG = " ".join(["the old fox near the river"] * 20)  # past the reranker's max_len of 24 with the query
DOCUMENTS = ["the small cat sat on the mat today", "a dog", LONG, "the red bird sat on the hill"]


@pytest.fixture
def reranking(ranked, ranked_dirs):
    """The session's server of a reranker (rr, as tests/serve/test_rerank.py reads it) and a plain encoder
    (plain: no rerank), at most 8 documents a request (tests/serve/conftest.py); (server, model
    directories)."""
    return ranked, ranked_dirs


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One Chromium over the DevTools pipe for the module's tests (a start is about a second of its own):
    each test opens its page in a tab of its own."""
    with Pipe(tmp_path_factory.mktemp("chromium")) as chromium:
        yield chromium


def ask(browser, **fields) -> tuple:
    """Set the page's hash (the form is filled from it and sent); (state, status line, answer,
    summary's kind)."""
    hash_ = "#" + "&".join(f"{k}={quote(str(v))}" for k, v in fields.items())
    browser.call("Runtime.evaluate",
                 {"expression": "document.getElementById('result').dataset.state = 'asked'; "
                                f"location.hash = {json.dumps(hash_)}"})
    state = browser.wait_for(ANSWERED)
    said = browser.wait_for("[document.getElementById('status').textContent, "
                            "document.getElementById('result').textContent, "
                            "document.getElementById('summary').dataset.kind || '']")
    return state, said[0], json.loads(said[1]), said[2]


def cells(browser, rows: str) -> list:
    """The text of each cell of the summary's rows `rows` (a CSS selector)."""
    return json.loads(browser.wait_for(f"JSON.stringify([...document.querySelectorAll('#summary {rows}')]"
                                       ".map(r => [...r.cells].map(c => c.textContent)))"))


def opened(browser, url: str) -> None:
    """Open the page at `url` and wait until it has read /v1/models."""
    browser.open(url)
    browser.wait_for("document.getElementById('models').textContent")


def test_page_runs_an_embedding_request_and_shows_the_answer(server, model_dirs, browser):
    text = "the quick dog sat near the river"
    # the page as a tab of the module's Chromium (a one-shot --dump-dom run started one of its own): the
    # document once the page's own script has shown the answer
    browser.open(f"{server.url}/#route=embed&model=enc&text={text.replace(' ', '%20')}")
    browser.wait_for(ANSWERED)
    dom = browser.wait_for("document.documentElement.outerHTML")
    match = re.search(r'<pre id="result" data-state="(\w+)">(.*?)</pre>', dom, re.DOTALL)
    assert match and match.group(1) == "done", dom[-2000:]
    answer = json.loads(html.unescape(match.group(2)))
    expected = SentenceEncoder.from_dir(model_dirs["enc"]).encode([text])[0]
    assert (torch.tensor(answer["embeddings"][0]) - expected).abs().max() <= 1e-5


def test_page_streams_a_generation(server, browser):
    # a streamed body does not hold virtual time: wait in real time over the DevTools pipe
    browser.open(f"{server.url}/#route=generate&model=gen&text=the%20cat")
    text = browser.wait_for(RESULT)
    status = browser.wait_for("document.getElementById('status').textContent")
    streamed, final = text.split("\n\n", 1)
    final = json.loads(final)
    assert status.startswith("200 POST /generate")
    assert final["finish_reason"] in ("stop", "length") and streamed == final["text"] and final["token_ids"]


@pytest.mark.parametrize("asked", ["route=predict&model=cls&text=the%20cat%20sat",
                                   pytest.param("route=features&model=enc&text=the%20cat%20sat&layers=0,-1",
                                                marks=pytest.mark.slow)])
def test_page_renders_not_blank(server, browser, asked):
    browser.open(f"{server.url}/#{asked}")
    browser.call("Emulation.setDeviceMetricsOverride",
                 {"width": 1280, "height": 860, "deviceScaleFactor": 1, "mobile": False})
    assert browser.wait_for(ANSWERED) == "done"  # the answer is in the panel before the shot is taken
    shot = browser.call("Page.captureScreenshot", {"format": "png"})["result"]["data"]
    pixels = imread(io.BytesIO(base64.b64decode(shot)), format="png")[..., :3]
    assert pixels.shape[:2] == (860, 1280)
    rgb = (pixels * 255).astype(np.uint8).reshape(-1, 3).astype(np.uint32)
    # one integer a colour: np.unique(rgb, axis=0) counted the same rows in over a second
    colours = np.unique(rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2])
    assert len(colours) > 50 and pixels.std() > 0.1  # text, panels, a header: not one flat colour
    panel = pixels[130:380, 612:1240]  # the answer panel shows the prediction's JSON, the features' tokens
    assert panel.std() > 0.05


def test_page_shows_the_attention_view_which_runs_in_the_browser(server, browser):
    frame = "document.getElementById('view').contentDocument"
    browser.open(f"{server.url}/#route=attention&model=enc&text=the%20red%20fox%20sat")
    assert "attention view below" in browser.wait_for(RESULT)
    browser.wait_for(f"{frame} && {frame}.readyState === 'complete' && !!{frame}.getElementById('tabs')")
    # the view as served drives each of its own controls (#selftest) without a script error
    browser.call("Page.navigate", {"url": "about:blank"})
    browser.call("Page.navigate", {"url": f"{server.url}/attention?model=gen&text=the%20red%20fox%20sat"
                                          "#selftest"})
    browser.wait_for("document.getElementById('selftest') && "
                     "document.getElementById('selftest').dataset.done", 60)
    result = json.loads(browser.wait_for("document.getElementById('selftest').textContent"))
    assert result["errors"] == [] and len(result["steps"]) > 5


def test_the_offline_api_reference_lists_every_route_with_its_fields(server, browser):
    browser.open(f"{server.url}/docs")
    dom = browser.wait_for("(() => { const d = document.documentElement.outerHTML; "
                           "return d.includes('data-state=\"done\"') && d; })()")
    assert 'data-state="done"' in dom, dom[-2000:]
    for route in ("/v1/embeddings", "/embed", "/features", "/rerank", "/v1/rerank", "/predict", "/fill_mask",
                  "/generate", "/v1/completions", "/attention", "/tokenize", "/health", "/info", "/v1/models",
                  "/metrics"):
        assert f'<span class="path">{route}</span>' in dom, route
    assert "Query parameters" in dom and ">text_pair<" in dom and ">encoding_format<" in dom


def test_page_offers_routes_and_models_by_capability(reranking, browser):
    served, _ = reranking
    show = ("(() => {{ const r = document.getElementById('route'); r.value = '{}'; "
            "r.dispatchEvent(new Event('change')); return JSON.stringify({{"
            "models: [...document.getElementById('model').options].map(o => o.value), "
            "shown: [...document.querySelectorAll('fieldset.options')].filter(f => !f.hidden)"
            ".map(f => f.dataset.group)}}); }})()")
    opened(browser, served.url + "/")
    disabled = json.loads(browser.wait_for("JSON.stringify([...document.getElementById('route').options]"
                                           ".filter(o => o.disabled).map(o => o.value))"))
    seen = {route: json.loads(browser.wait_for(show.format(route)))
            for route in ("rerank", "v1_rerank", "features", "embed", "embeddings", "tokenize", "health")}
    assert set(disabled) == {"predict", "fill_mask", "generate", "completions"}  # no served model can
    assert seen["rerank"] == seen["v1_rerank"] == {"models": ["", "rr"], "shown": ["rerank"]}
    assert seen["features"] == {"models": ["", "rr", "plain"], "shown": ["features"]}  # in /v1/models order
    assert seen["embed"]["shown"] == seen["embeddings"]["shown"] == ["embed"]
    assert seen["tokenize"]["shown"] == seen["health"]["shown"] == []


def test_page_reranks_showing_order_scores_and_truncation(reranking, browser):
    served, dirs = reranking
    offline = lmforge.rerank(dirs["rr"], QUERY, DOCUMENTS)
    opened(browser, served.url + "/")
    state, status, answer, kind = ask(browser, route="rerank", model="rr", query=QUERY,
                                      text="\n".join(DOCUMENTS), top_n=3)
    best = cells(browser, "tr.ranked")
    state_all, _, every, _ = ask(browser, route="v1_rerank", query=QUERY, text="\n".join(DOCUMENTS),
                                 return_documents="true")
    rows = cells(browser, "tr.ranked")
    assert state == "done" and status.startswith("200 POST /rerank") and kind == "rerank"
    assert [r["index"] for r in answer["results"]] == [i for i, _ in offline[:3]]
    scores = [r["relevance_score"] for r in answer["results"]]
    assert scores == pytest.approx([s for _, s in offline[:3]], abs=1e-5)
    assert [row[:3] for row in best] == [[str(rank + 1), str(r["index"]), f"{r['relevance_score']:.6f}"]
                                         for rank, r in enumerate(answer["results"])]
    assert state_all == "done" and [r["index"] for r in every["results"]] == [i for i, _ in offline]
    for row, result in zip(rows, every["results"]):  # each document's truncation, and its text
        assert result["truncated"] == (result["index"] == 2)  # LONG alone is past max_len
        assert row[3] == ("truncated" if result["truncated"] else "whole")
        assert DOCUMENTS[result["index"]].startswith(row[4].rstrip("…"))


@pytest.mark.slow  # the default suite keeps one page test per route
def test_page_shows_rerank_refusals_naming_the_limit_or_field(reranking, browser):
    served, _ = reranking
    opened(browser, served.url + "/")
    too_many = ask(browser, route="rerank", query=QUERY, text="\n".join(DOCUMENTS + ["one more"] * 5))
    box = browser.wait_for("document.getElementById('summary').textContent")
    bad_top = ask(browser, route="rerank", query=QUERY, text="a dog", top_n=0)
    marked = browser.wait_for("JSON.stringify([...document.querySelectorAll('.field-bad')]"
                              ".map(c => c.dataset.field))")
    not_rr = ask(browser, route="rerank", model="plain", query=QUERY, text="a dog")
    assert too_many[0] == "error" and too_many[1].startswith("413 POST /rerank")
    assert too_many[2]["error"]["param"] == "max_documents" and too_many[3] == "refusal"
    assert "Refused (413)" in box and "limit: max_documents" in box
    assert bad_top[1].startswith("422") and bad_top[2]["error"]["param"] == "top_n"
    assert json.loads(marked) == ["top_n"]  # the form's top_n is marked
    assert not_rr[1].startswith("422") and not_rr[2]["error"]["param"] == "model"


def test_page_tries_features_showing_tokens_offsets_and_shape(server, browser):
    text = "the red fox sat near the river"
    width = server.client().get("/info").json()["models"]["enc"]["d_model"]
    opened(browser, server.url + "/")
    state, status, answer, kind = ask(browser, route="features", model="enc", text=text, layers="0,-1")
    tokens = cells(browser, "tr.token")
    shape = browser.wait_for("document.querySelector('#summary .shape').textContent")
    mixed = ask(browser, route="features", model="enc", text=text, layers="mix", mix_weights="1, 2, 3",
                pooling="mean_max")
    mixed_shape = browser.wait_for("document.querySelector('#summary .shape').textContent")
    refused = ask(browser, route="features", model="enc", text=text, layers="7")
    marked = browser.wait_for("JSON.stringify([...document.querySelectorAll('.field-bad')]"
                              ".map(c => c.dataset.field))")
    direct = server.client().post("/features",
                                  json={"model": "enc", "texts": [text], "layers": "0,-1"}).json()
    assert state == "done" and status.startswith("200 POST /features") and kind == "features"
    item = answer["data"][0]
    torch.testing.assert_close(torch.tensor(item["features"]), torch.tensor(direct["data"][0]["features"]),
                               atol=1e-5, rtol=1e-4)
    n = item["n_tokens"]
    assert f"shape 2 × {n} × {width} (layers × tokens × d)" in shape and "layers [0,2]" in shape
    assert len(tokens) == n == len(item["tokens"])
    for row, token in zip(tokens, item["tokens"]):  # the text each token covers, and where
        assert row[3] == json.dumps(text[token["start"]:token["end"]])
        assert row[4] == f"{token['start']}–{token['end']}"
    assert mixed[0] == "done" and f"shape 1 × {2 * width} (layers × d)" in mixed_shape
    assert refused[1].startswith("422") and refused[2]["error"]["param"] == "layers"
    assert json.loads(marked) == ["layers"] and refused[3] == "refusal"


@pytest.mark.slow  # the default suite keeps one page test per route
def test_page_sends_the_embedding_options(server, browser):
    opened(browser, server.url + "/")
    cut = ask(browser, route="embed", model="enc", text="a cat", dimensions=8)
    summary = browser.wait_for("document.getElementById('summary').textContent")
    packed = ask(browser, route="embeddings", model="enc", text="a cat", encoding_format="base64")
    refused = ask(browser, route="embeddings", model="enc", text="a cat", encoding_format="int8")
    marked = browser.wait_for("JSON.stringify([...document.querySelectorAll('.field-bad')]"
                              ".map(c => c.dataset.field))")
    assert cut[0] == "done" and cut[2]["dim"] == 8 and len(cut[2]["embeddings"][0]) == 8
    assert "dim 8" in summary and f"0 ({cut[2]['inputs'][0]['tokens']} tokens): " in summary
    assert packed[0] == "done" and isinstance(packed[2]["data"][0]["embedding"], str)
    assert refused[1].startswith("422") and refused[2]["error"]["param"] == "encoding_format"
    assert json.loads(marked) == ["encoding_format"]
