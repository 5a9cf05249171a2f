"""Limits push back: 413 naming the limit for oversize requests, 429 with Retry-After when the queue is
full, and under ten times the batch capacity no answer is lost, late or mixed up."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
import torch

from lmforge.pipelines.embed import SentenceEncoder
from lmforge.serve.limits import MAX_TOKEN_CHARS, read_heads, text_head
from tests.serve.test_routes import metric, texts_of_mixed_length


@pytest.mark.parametrize("path, body, limit", [
    ("/embed", {"texts": ["the cat sat on the mat " * 3] * 20}, "max_request_tokens"),
    ("/embed", {"texts": ["word " * 200]}, "max_seq_len"),
    ("/v1/embeddings", {"input": "word " * 200}, "max_seq_len"),
    ("/generate", {"model": "gen", "prompt": "the cat", "max_new_tokens": 51}, "max_new_tokens"),
    ("/fill_mask", {"text": "the [MASK] sat", "top_k": 11}, "max_top_k"),
    ("/embed", {"texts": ["x" * 3000]}, "max_body_bytes"),
])
def test_oversize_requests_are_413_naming_the_limit(tight, path, body, limit):
    answer = httpx.post(tight.url + path, json=body, timeout=30)
    assert answer.status_code == 413, answer.text
    error = answer.json()["error"]
    assert error["param"] == limit and limit in error["message"]


def test_truncate_cuts_instead_of_refusing(tight, model_dirs):
    text = "the old red fox " * 60
    answer = httpx.post(tight.url + "/embed", json={"texts": [text], "truncate": True}, timeout=30)
    assert answer.status_code == 200, answer.text
    expected = SentenceEncoder.from_dir(model_dirs["enc"]).encode([text])[0]  # the library truncates the same
    assert (torch.tensor(answer.json()["embeddings"][0]) - expected).abs().max() <= 1e-5


def test_a_chunked_body_over_the_limit_is_413(tight):
    def chunks():
        for _ in range(10):
            yield b'{"texts": ["' + b"a" * 400
        yield b'"]}'

    answer = httpx.post(tight.url + "/embed", content=chunks(), headers={"content-type": "application/json"},
                        timeout=30)
    assert answer.status_code == 413 and answer.json()["error"]["param"] == "max_body_bytes"


async def _burst(url: str, bodies: list) -> list:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        return await asyncio.gather(*(client.post("/embed", json=b) for b in bodies))


def test_ten_times_the_batch_capacity_gets_answers_or_429_never_lost_or_mixed(tight, model_dirs):
    texts = texts_of_mixed_length(40, seed=5, longest=25)  # 10 x max_batch_items=4 requests at once
    encoder = SentenceEncoder.from_dir(model_dirs["enc"])
    offline = encoder.encode(texts, batch_size=1)  # each text alone
    pending, refusals = list(range(len(texts))), 0
    for _ in range(20):  # a polite client sends again what was refused: every text gets its answer
        start = time.monotonic()
        answers = asyncio.run(_burst(tight.url, [{"texts": [texts[i]]} for i in pending]))
        assert time.monotonic() - start < 20  # pushed back at once, not left to time out
        for i, answer in zip(pending, answers):
            assert answer.status_code in (200, 429), answer.text
            if answer.status_code == 429:
                assert answer.json()["error"]["param"] == "max_queue"
                assert int(answer.headers["Retry-After"]) >= 1
            else:
                got = torch.tensor(answer.json()["embeddings"][0])
                assert (got - offline[i]).abs().max() <= 1e-5, "an answer was mixed up"
        refused = [i for i, a in zip(pending, answers) if a.status_code == 429]
        refusals += len(refused)
        pending = refused
        if not pending:
            break
        time.sleep(0.05)
    assert not pending and refusals > 0


def test_requests_beyond_the_item_cap_are_split_and_answered_as_one(tight, model_dirs):
    texts = texts_of_mixed_length(11, seed=6, longest=20)  # 3 forward passes of at most 4 texts
    answer = httpx.post(tight.url + "/v1/embeddings", json={"input": texts}, timeout=30)
    assert answer.status_code == 200, answer.text
    data = answer.json()["data"]
    assert [d["index"] for d in data] == list(range(11))
    encoder = SentenceEncoder.from_dir(model_dirs["enc"])
    for text, d in zip(texts, data):
        assert (torch.tensor(d["embedding"]) - encoder.encode([text])[0]).abs().max() <= 1e-5


def test_bad_fields_are_422_naming_the_field(tight):
    cases = [("/generate", {"prompt": "x", "top_p": 1.5}, "top_p"), ("/embed", {"texts": "x", "normalise": 1},
                                                                     "normalise"),
             ("/generate", {"prompt": "x", "num_beams": 2, "stream": True}, "stream"),
             ("/generate", {"prompt": "x", "num_beams": 2, "temperature": 0.5}, "num_beams"),
             ("/embed", {"texts": ["a", 5]}, "texts.1"),
             ("/predict", {"inputs": ["a", 5]}, "inputs.1")]  # the index, not the union branch
    for path, body, field in cases:
        answer = httpx.post(tight.url + path, content=json.dumps(body), timeout=30,
                            headers={"content-type": "application/json"})
        assert answer.status_code == 422 and answer.json()["error"]["param"] == field, answer.text
    answer = httpx.post(tight.url + "/embed", content=b'{"texts": "x",', timeout=30,
                        headers={"content-type": "application/json"})
    error = answer.json()["error"]  # no field is wrong: the body is not JSON (was "14: JSON decode error")
    assert answer.status_code == 422 and error["param"] == "body", answer.text
    assert error["message"].startswith("request body is not valid JSON: ")
    assert error["message"].endswith("(character 14)"), error


def test_refusals_outside_the_routes_have_the_error_shape_too(tight):
    cases = [("GET", "/predict", None, 405, "GET is not allowed on /predict"),
             ("GET", "/no-such-route", None, 404, "no route /no-such-route"),
             ("POST", "/embed", b"", 422, "the request has no body")]
    for method, path, body, status, message in cases:
        answer = httpx.request(method, tight.url + path, content=body, timeout=30,
                               headers={"content-type": "application/json"})
        error = answer.json()["error"]
        assert answer.status_code == status and error["code"] == status, answer.text
        assert error["message"].startswith(message) and set(error) == {"message", "type", "param", "code"}


def test_truncate_cuts_a_huge_text_before_tokenising_it(server, model_dirs):
    encoder = SentenceEncoder.from_dir(model_dirs["enc"])
    huge, spaces = "the old red fox " * 60000, "cat" + " " * 40000 + "dog"  # ~1 MB; 40 kB of 3 tokens
    tokenized = metric(server.url, "lmforge_phase_seconds", "lmforge_phase_seconds_sum", phase="tokenize")
    with server.client() as client:
        cut = client.post("/embed", json={"model": "enc", "texts": [huge], "truncate": True})
        refused = client.post("/v1/embeddings", json={"model": "enc", "input": huge})
        sparse = client.post("/embed", json={"model": "enc", "texts": [spaces]})
    assert cut.status_code == 200, cut.text
    assert (torch.tensor(cut.json()["embeddings"][0]) - encoder.encode([huge])[0]).abs().max() <= 1e-5
    assert cut.json()["tokens"] == 128  # the model's max_seq_len
    assert refused.status_code == 413 and refused.json()["error"]["param"] == "max_seq_len"
    # a long text of few tokens is counted whole and served as it is
    assert sparse.status_code == 200 and sparse.json()["tokens"] == len(encoder.tokenizer.encode(spaces).ids)
    assert (torch.tensor(sparse.json()["embeddings"][0]) - encoder.encode([spaces])[0]).abs().max() <= 1e-5
    # 2 MB of text were never tokenised whole (that alone takes seconds)
    after = metric(server.url, "lmforge_phase_seconds", "lmforge_phase_seconds_sum", phase="tokenize")
    assert after - tokenized < 0.5


def test_the_server_answers_others_while_a_huge_request_is_counted(server):
    huge = {"model": "cls", "inputs": ["word " * 600_000]}  # 3 MB: seconds of tokenising, then a 413
    done: dict = {}

    def send() -> None:
        start = time.monotonic()
        done["status"] = httpx.post(server.url + "/predict", json=huge, timeout=120).status_code
        done["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=send)
    thread.start()
    time.sleep(0.5)  # the body is in; its counting has begun
    waits = []
    while thread.is_alive() and len(waits) < 20:
        start = time.monotonic()
        assert httpx.get(server.url + "/health", timeout=60).status_code == 200
        waits.append(time.monotonic() - start)
        time.sleep(0.05)
    thread.join(120)
    assert done["status"] == 413 and waits
    assert max(waits) < max(0.5 * done["seconds"], 0.75), (waits, done)  # the event loop was never held


def test_a_generation_job_weighs_its_beams_as_the_request_bound_does():
    from types import SimpleNamespace

    from lmforge.serve.generation import Settings
    from lmforge.serve.streaming import _job

    config = SimpleNamespace(max_seq_len=64, architecture="decoder", eos_token_id=None, pad_token_id=None)
    served = SimpleNamespace(model=SimpleNamespace(config=config), path="nowhere",  # no generation_config
                             front=SimpleNamespace(eos_id=None, pad_id=None))
    _, greedy = _job(served, "prompt", [1, 2, 3], Settings({"max_new_tokens": 10}))
    _, beams = _job(served, "prompt", [1, 2, 3], Settings({"max_new_tokens": 10, "num_beams": 4}))
    assert greedy == 13 and beams == 4 * 13  # each beam holds its own sequence: Retry-After counts them


@pytest.mark.parametrize("path, body", [("/embed", {"model": "x" * 1_000_000, "texts": "a"}),
                                        ("/generate", {"prompt": "a", "early_stopping": "x" * 1_000_000}),
                                        ("/tokenize", {"text": "a", "x" * 100_000: 1})])
def test_an_error_echoing_a_huge_value_is_bounded_head_and_tail(local, path, body):
    """A 1 MB model name came back whole in its 404 (and an unknown 100 kB key as the param); early_stopping's
    refusal is cut where it is made (generate/options.py), the others elided by the server."""
    answer = local.post(path, json=body)
    assert answer.status_code in (404, 422) and len(answer.content) < 2500
    error = answer.json()["error"]
    assert len(error["message"]) < 400 and len(error["param"]) < 300
    assert "characters left out" in error["message"] or path == "/generate"
    assert error["message"].startswith(("model 'xxx", "early_stopping", "xxx"))
    assert answer.status_code == 422 or error["message"].endswith("(served: enc, gen)")  # the tail kept


def test_read_heads_reads_a_few_token_head_whole_in_one_count():
    calls = []

    async def count(texts):  # one token a word, plus a pair's one query token
        calls.append(list(texts))
        return [len(t.split()) + 1 for t in texts]

    room = 2 * MAX_TOKEN_CHARS
    many, blank, long_word = "x " * 200, " " * 300 + "a b c", "y" * 300 + " z"
    texts = ["a b", many, blank, long_word]
    heads, counts = asyncio.run(read_heads(count, texts, 2, taken=1))
    assert heads == ["a b", text_head(many, room), blank, long_word]
    assert counts == [3, MAX_TOKEN_CHARS + 1, 4, 3]
    assert calls[1:] == [[blank, long_word]]  # the whole texts: one more call, not one a text
