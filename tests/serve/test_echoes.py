"""A refusal that repeats a client's value (a number past a limit, a model's name, a field's key) repeats at
most about limits.ECHO characters of it, its middle left out, so that every refusal stays one short line:
a 4,000-digit top_k came back whole in a 1,036-character 413."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from lmforge.heads import attach
from lmforge.serve.app import create_app
from lmforge.serve.limits import ECHO, Limits, RequestError, check_generation, echoed
from lmforge.serve.models import load_served
from tests.serve.conftest import _save, _tiny, _tokenizer

HUGE = int("9" * 4000)  # JSON carries it; Python prints it whole
LONG = "x" * 4000
SHORT = 200  # characters of a refusal's message that is one short line


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """A client of the server's app on a BERT with its masked-LM head and a GPT-2 with its LM head."""
    root = tmp_path_factory.mktemp("echoes")
    bert, gpt = _tokenizer("bert"), _tokenizer("gpt2")
    encoder, decoder = _tiny("bert-base", bert, 3, max_seq_len=32), _tiny("gpt2", gpt, 4, max_seq_len=64)
    attach(encoder, "lm")
    attach(decoder, "lm")
    dirs = {"bert": _save(encoder, bert, root / "bert"), "gpt": _save(decoder, gpt, root / "gpt")}
    with TestClient(create_app({n: load_served(n, d) for n, d in dirs.items()}, threads=1)) as client:
        yield client


def test_echoed_keeps_a_short_value_whole_and_a_long_one_s_head_and_tail():
    assert echoed(12345) == "12345" and echoed("bert") == "bert"
    said = echoed(HUGE)
    assert len(said) < 2 * ECHO and said.startswith("9" * (ECHO // 2)) and "3960 characters left out" in said


@pytest.mark.parametrize("field, limit", [("max_new_tokens", "max_new_tokens"),
                                          ("num_beams", "max_num_beams"), ("top_k", "max_sampling_top_k")])
def test_a_generation_s_count_past_its_limit_is_echoed_short(field, limit):
    body = type("Body", (), {"num_beams": 1, "top_k": 0, field: HUGE})()
    with pytest.raises(RequestError) as refused:
        check_generation(body, HUGE if field == "max_new_tokens" else 4, Limits())
    said = refused.value.message
    assert refused.value.status == 413 and refused.value.param == limit
    assert len(said) < SHORT and f"{limit}={getattr(Limits(), limit)}" in said


@pytest.mark.parametrize("path, body, status, param", [
    ("/fill_mask", {"model": "bert", "text": "a [MASK]", "top_k": HUGE}, 413, "max_top_k"),
    ("/generate", {"model": "gpt", "prompt": "a", "max_new_tokens": 10**300}, 413, "max_new_tokens"),
    ("/generate", {"model": "gpt", "prompt": "a", "num_beams": 10**300}, 413, "max_num_beams"),
    ("/v1/completions", {"model": "gpt", "prompt": "a", "max_tokens": 10**300}, 413, "max_new_tokens"),
    ("/embed", {"model": LONG, "texts": ["a"]}, 404, "model"),
], ids=["fill-top_k", "generate-max_new_tokens", "generate-num_beams", "completions-max_tokens", "model"])
def test_a_refusal_echoing_a_huge_value_is_one_short_line(client, path, body, status, param):
    error = client.post(path, json=body).json()["error"]
    assert (error["code"], error["param"]) == (status, param), error["message"][:200]
    assert len(error["message"]) < SHORT and "\n" not in error["message"]


@pytest.mark.parametrize("raw, said", [
    ('{"model": "bert", "text": "a", "%s": 1}' % LONG, "Extra inputs are not permitted"),
    ('{"model": "bert", "text": "a", "%s": 1, "%s": 2}' % (LONG, LONG), "given twice"),
], ids=["unknown", "twice"])
def test_a_refusal_naming_a_huge_key_is_one_short_line(client, raw, said):
    answer = client.post("/tokenize", content=raw.encode(), headers={"content-type": "application/json"})
    error = answer.json()["error"]
    assert answer.status_code == 422 and said in error["message"], error["message"][:200]
    assert len(error["message"]) < SHORT and error["message"].startswith("x" * (ECHO // 2) + " ... ")
