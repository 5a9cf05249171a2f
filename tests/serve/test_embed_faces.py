"""One request, checked once, for serving: random embedding settings, in range or not, of the right
type or not, go through the three faces built from EmbedOptions (lmforge.embed, `lmforge embed`,
POST /embed) and the three accept and refuse alike, each refusal clean and naming the setting."""
from __future__ import annotations

from datetime import timedelta

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmforge
from lmforge.config.options import OptionsError
from tests.faces import SECONDS, cli_verdict, server_verdict, timed

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from lmforge.serve.app import create_app  # noqa: E402
from lmforge.serve.models import load_served  # noqa: E402

TEXT = "the cat sat on the mat"
NAN, INF = float("nan"), float("inf")
WRONG = st.sampled_from(["abc", "", [1], {"a": 1}])  # never a number's or a bool's text: the CLI reads text
FIELDS = {
    "dimensions": st.one_of(st.integers(1, 32), st.sampled_from([0, -3, 10**9, 2.5, NAN, INF]), WRONG),
    "encoding_format": st.one_of(st.sampled_from(["float", "base64", "binary", "ubinary"]),
                                 st.sampled_from(["int4", "FLOAT", ""])),
    "truncate": st.sampled_from([True, False, "chunk", "maybe", "sometimes"]),
    "max_chunks": st.one_of(st.integers(1, 8), st.sampled_from([0, 257, 10**12, NAN]), WRONG),
    "max_length": st.one_of(st.integers(1, 40), st.sampled_from([0, 10**9, 2.5, NAN]), WRONG),  # model: 32
    "prompt": st.one_of(st.sampled_from(["query: ", ""]), st.just("x" * 5000)),
}
REQUESTS = st.fixed_dictionaries({}, optional=FIELDS)


@pytest.fixture(scope="module")
def faces(tiny_embedder):
    """(model directory, a client of the server's app on that model)."""
    return tiny_embedder


_timed = timed


def _python(path, request: dict):
    """None when accepted, else the refusal's field."""
    try:
        _timed(lambda: lmforge.embed([TEXT], path, **request))
    except OptionsError as err:
        assert "\n" not in str(err) and err.field in str(err)
        return err.field
    return None


def _text(value) -> str:
    return repr(value) if isinstance(value, float) else \
        str(value).lower() if isinstance(value, bool) else value


def _cli(path, request: dict):
    """None when accepted, else the one error line (exit status 2, nothing on standard output)."""
    return cli_verdict(["embed", "--model", str(path), TEXT], request, _text)


def _server(client, request: dict):
    """None when accepted, else the error's parameter and message (413 or 422)."""
    refusal, answer = server_verdict(client, "/embed", {"model": "embed", "texts": [TEXT], **request})
    assert refusal is not None or len(answer["embeddings"]) == 1
    return refusal


@settings(max_examples=40, deadline=timedelta(seconds=3 * SECONDS),
          suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(request=REQUESTS)
def test_the_three_faces_accept_and_refuse_alike(faces, request):
    path, client = faces
    python, cli, server = _python(path, request), _cli(path, request), _server(client, request)
    verdicts = {"python": python is None, "cli": cli is None, "server": server is None}
    assert len(set(verdicts.values())) == 1, (request, python, cli, server)
    if python is not None:  # each refusal names a setting of the request
        assert python in request, (request, python)
        assert any(f"--{name.replace('_', '-')}" in cli or name in cli for name in request), (request, cli)
        assert any(name in server for name in request), (request, server)


def test_a_prompt_that_fills_the_window_is_refused_naming_prompt_on_every_face(faces):
    """A prompt whose tokens, with the special ones, fill max_length left truncate=true nothing of the text:
    every text got the prompt's one vector, on all three faces; now each refuses it naming prompt."""
    path, client = faces
    prompt = "the " * 40  # 40 tokens; the model reads 32
    python, cli = _python(path, {"prompt": prompt, "truncate": True}), _cli(path, {"prompt": prompt,
                                                                                   "truncate": True})
    server = _server(client, {"prompt": prompt, "truncate": True})
    assert python == "prompt" and "--prompt" in cli and server.startswith("prompt: "), (python, cli, server)
    assert _server(client, {"prompt": "the " * 6, "max_length": 8, "truncate": True}).startswith("prompt: ")
    room = lmforge.embed([TEXT, "a dog"], path, prompt="the " * 6, max_length=9, truncate=True)
    assert not torch.equal(room[0], room[1])  # one token of room: each text still read
    assert _server(client, {"prompt": prompt, "truncate": "chunk"}) is None  # its later windows read the text


def test_embed_checks_the_prompt_with_the_event_loops_tokenizer_not_the_workers(faces):
    """/embed's prompt check ran on the event loop with the workers' tokenizer, whose every encode takes the
    lock a worker holds while it encodes a batch: the event loop, every request with it, waited on that
    batch. It counts with the event loop's own copy (served.front), as the texts are counted."""
    path, _ = faces
    served = load_served("embed", path)
    assert served.front is not served.tokenizer
    used, encode = [], served.tokenizer.encode
    served.tokenizer.encode = lambda *args, **kw: used.append(args) or encode(*args, **kw)
    with TestClient(create_app({"embed": served}, threads=1)) as client:
        refused = client.post("/embed", json={"texts": [TEXT], "prompt": "the " * 40, "truncate": True})
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "prompt", refused.text
    assert used == []  # the route refused it before any worker's work, without the workers' tokenizer


def test_embed_tokenises_the_prompt_alone_once_a_request_on_the_event_loop(faces):
    """The route measures the prompt with the event loop's tokenizer for its room check; the workers get it
    in the texts (options without a prompt), so neither tokenizer reads the prompt alone a second time."""
    path, _ = faces
    served, prompt, alone = load_served("embed", path), "query: ", []
    for tokenizer in (served.front, served.tokenizer):
        was = tokenizer.encode
        tokenizer.encode = lambda text, *a, was=was, **kw: alone.append(text) or was(text, *a, **kw)
    with TestClient(create_app({"embed": served}, threads=1)) as client:
        answer = client.post("/embed", json={"texts": [TEXT, "a dog"], "prompt": prompt, "truncate": True})
    assert answer.status_code == 200, answer.text
    assert alone.count(prompt) == 1, alone


def test_embed_counts_each_text_once_on_the_event_loop(faces):
    """The route counts each text (its 413s, the batch budget) and the job carries the counts: the workers'
    tokenizer counted every text a second time before it encoded the batch."""
    path, _ = faces
    served, texts, counted = load_served("embed", path), [TEXT, "a dog"], {"front": [], "worker": []}
    for name, tokenizer in (("front", served.front), ("worker", served.tokenizer)):
        was = tokenizer.encode
        tokenizer.encode = lambda text, *a, was=was, name=name, **kw: counted[name].append(text) or \
            was(text, *a, **kw)
    with TestClient(create_app({"embed": served}, threads=1)) as client:
        answer = client.post("/embed", json={"texts": texts, "truncate": True})
    assert answer.status_code == 200, answer.text
    assert sorted(counted["front"]) == sorted(texts) and counted["worker"] == [], counted
    assert [i["tokens"] for i in answer.json()["inputs"]] == [len(served.front.encode(t).ids) for t in texts]
