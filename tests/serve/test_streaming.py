"""Generation routes: a streamed answer ends with finish_reason and [DONE], or with an error event and no
[DONE] (a stream cut short is never taken for a whole one); an empty stop string is refused, naming it."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from lmforge.serve import generation
from lmforge.serve.limits import RequestError

GENERATE = {"model": "gen", "prompt": "the cat", "max_new_tokens": 3, "stream": True}
COMPLETE = {"model": "gen", "prompt": ["the cat", "a dog"], "max_tokens": 3, "temperature": 0, "stream": True}


def _events(client, path: str, body: dict) -> list:
    with client.stream("POST", path, json=body) as answer:
        assert answer.status_code == 200
        return [line[6:] for line in answer.iter_lines() if line.startswith("data: ")]


@pytest.mark.parametrize("path, body", [("/generate", GENERATE), ("/v1/completions", COMPLETE)])
def test_a_stream_ends_with_its_finish_reason_then_done(local, path, body):
    events = _events(local, path, body)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    reason = last["finish_reason"] if path == "/generate" else last["choices"][0]["finish_reason"]
    prompts = 1 if isinstance(body["prompt"], str) else len(body["prompt"])
    assert reason == "length" and last["usage"]["completion_tokens"] == 3 * prompts  # the request's


def test_a_streamed_completion_s_usage_is_the_whole_reply_s(local):
    """The stream's last chunk says the request's usage, summed over its prompts as the whole reply's is, and
    no earlier chunk has any: it said the last prompt's alone (3 tokens of 6), and each prompt's its own."""
    chunks = [json.loads(e) for e in _events(local, "/v1/completions", COMPLETE)[:-1]]
    whole = local.post("/v1/completions", json={**COMPLETE, "stream": False}).json()
    assert chunks[-1]["usage"] == whole["usage"] and whole["usage"]["completion_tokens"] == 6
    assert all("usage" not in c for c in chunks[:-1])


@pytest.mark.parametrize("path, body", [("/generate", GENERATE), ("/v1/completions", COMPLETE)])
def test_an_unexpected_error_mid_stream_is_its_last_event_not_a_cut(local, path, body, monkeypatch):
    """Was a stream that stopped after its last token, no error and no [DONE] (only a ValueError was told)."""
    def failing(served, payload, emit):
        emit({"text": "a", "token_ids": [1]})
        raise RuntimeError("the device failed\nmore detail")

    monkeypatch.setattr(generation, "run", failing)
    events = _events(local, path, body)
    assert "[DONE]" not in events and len(events) == 2  # the token, then the error
    error = json.loads(events[-1])["error"]
    assert error["code"] == 500 and error["type"] == "server_error"
    assert error["message"] == "internal error: RuntimeError: the device failed"


@pytest.mark.parametrize("path, body, field", [
    ("/generate", {**GENERATE, "stream": False, "stop": ""}, "stop"),
    ("/generate", {**GENERATE, "stop": ["cat", ""]}, "stop.1"),
    ("/v1/completions", {**COMPLETE, "stop": [""]}, "stop.0"),
])
def test_an_empty_stop_string_is_422_naming_it(local, path, body, field):
    """Was dropped unsaid (the text went on as if no stop string had been sent)."""
    answer = local.post(path, json=body)
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["param"] == field and error["message"].startswith(f"{field}: a stop string is empty")


def test_a_stream_whose_client_hangs_up_while_queued_gives_its_place_back(server):
    """Was held in the queue until the generation before it ended, then ran a step for nobody."""
    from tests.serve.test_routes import metric

    long = {"model": "gen", "prompt": "the cat", "max_new_tokens": 1900, "min_new_tokens": 1900,
            "stream": True}
    with server.client() as client, client.stream("POST", "/generate", json=long) as running:
        lines = running.iter_lines()  # kept: a dropped iterator closes the stream, ending the generation
        next(lines)  # the one worker is busy with it
        before = metric(server.url, "lmforge_generations_total")
        with server.client(timeout=httpx.Timeout(5, read=0.3)) as queued, pytest.raises(httpx.ReadTimeout):
            queued.post("/generate", json=GENERATE)  # behind it: no answer yet; hangs up after 0.3 s
        deadline = time.monotonic() + 10.0  # a loaded machine's server notices late
        while metric(server.url, "lmforge_queue_requests") > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert metric(server.url, "lmforge_queue_requests") == 1  # the running one's alone
    deadline = time.monotonic() + 10.0  # a loaded machine's server notices late
    while metric(server.url, "lmforge_generations_total") == before and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)
    assert metric(server.url, "lmforge_generations_total") == before + 1  # the long one's end: the queued one
    # never ran (it would have run a step for nobody once the long one ended, then been cancelled)
    assert metric(server.url, "lmforge_queue_requests") == 0  # the stream cut short is counted out too


@pytest.mark.parametrize("value", [-1, 100.5, True, None])
def test_both_generation_routes_refuse_a_temperature_in_the_same_words(local, value):
    """/v1/completions said pydantic's "Input should be greater than or equal to 0" where /generate said
    GenerationOptions' bounds."""
    said = [local.post(path, json={**body, "stream": False, "temperature": value}).json()["error"]
            for path, body in (("/generate", GENERATE), ("/v1/completions", COMPLETE))]
    assert said[0] == said[1] and said[0]["param"] == "temperature" and said[0]["code"] == 422


@pytest.mark.parametrize("stream", [False, True])
def test_a_completion_of_several_prompts_is_admitted_once_before_any_runs(local, monkeypatch, stream):
    """Each prompt was admitted when its turn came (whole: when the one before it had run; streamed: when
    its events began): a queue filled meanwhile gave the request a 429 after its first prompts had run."""
    admission, admitted, released = local.app.state.server.admission, [], []
    monkeypatch.setattr(admission, "admit", admitted.append)
    monkeypatch.setattr(admission, "release", released.append)
    body = {**COMPLETE, "prompt": ["the cat", "a dog", "the bird"], "stream": stream}
    if stream:
        events = _events(local, "/v1/completions", body)
        assert events[-1] == "[DONE]"
        indexes = {json.loads(e)["choices"][0]["index"] for e in events[:-1]}
    else:
        answer = local.post("/v1/completions", json=body)
        assert answer.status_code == 200
        indexes = {c["index"] for c in answer.json()["choices"]}
    assert indexes == {0, 1, 2}
    assert len(admitted) == 1 and released == admitted  # one request, its three prompts' tokens, out once

    def full(tokens):
        raise RequestError(429, "the queue is full", param="max_queue")

    ran = []
    monkeypatch.setattr(admission, "admit", full)
    monkeypatch.setattr(generation, "run", lambda *a: ran.append(a))
    assert local.post("/v1/completions", json=body).status_code == 429 and ran == []
    assert released == admitted  # nothing counted out that was not counted in


def test_a_t5_without_decoder_start_starts_from_its_pad_token_on_every_face(model_dirs, capsys):
    """The command line started it from the pad token with a note, Python raised a bare ValueError, and
    the server answered 422 naming no field; now all three start from the pad token (T5's convention),
    saying so."""
    import warnings

    import torch
    from fastapi.testclient import TestClient

    import lmforge
    from lmforge.cli import main
    from lmforge.generate.checks import GenerationWarning
    from lmforge.serve import create_app, load_served

    path = model_dirs["t5"]
    model, tokenizer = lmforge.load(path), lmforge.load_tokenizer(path)
    assert model.config.decoder_start_token_id is None and model.config.pad_token_id is None
    ids = torch.tensor([tokenizer.encode("the cat").ids])
    with pytest.raises(lmforge.OptionsError, match="decoder_start_token_id") as refused:
        lmforge.generate(model, ids, max_new_tokens=3)  # no pad id either: nothing to start from
    assert refused.value.field == "decoder_start_token_id"
    with pytest.warns(GenerationWarning, match=f"starts from the pad token \\(id {tokenizer.pad_id}\\)"):
        python = lmforge.generate(model, ids, max_new_tokens=3, pad_token_id=tokenizer.pad_id)[0, 1:].tolist()
    with warnings.catch_warnings(), pytest.warns(GenerationWarning, match="starts from the pad token"):
        warnings.simplefilter("always")  # said again, as a new process says it (one line: cli/__init__)
        assert main(["generate", "--model", str(path), "the cat", "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert out == tokenizer.decode(python) + "\n"
    app = create_app({"t5": load_served("t5", path)}, threads=1)
    with TestClient(app, raise_server_exceptions=False) as client, warnings.catch_warnings(), \
            pytest.warns(GenerationWarning, match="starts from the pad token"):
        warnings.simplefilter("always")
        answer = client.post("/generate", json={"model": "t5", "prompt": "the cat", "max_new_tokens": 3})
    assert answer.status_code == 200, answer.text
    assert answer.json()["token_ids"] == python[:len(answer.json()["token_ids"])]  # cut at a stop, if any
    served = answer.json()["token_ids"]
    assert len(served) == 3 or python[len(served) - 1] == tokenizer.eos_id


@pytest.mark.parametrize("value", [0, -3, -0.0, 2.5, True, None])
def test_both_generation_routes_refuse_a_budget_of_new_tokens_in_the_same_words(local, value):
    """/v1/completions said pydantic's "Input should be greater than or equal to 1" of a max_tokens below 1
    where /generate said GenerationOptions' bounds of max_new_tokens; each names its own field."""
    said = [local.post(path, json={**body, "stream": False, name: value}).json()["error"]
            for path, body, name in (("/generate", GENERATE, "max_new_tokens"),
                                     ("/v1/completions", COMPLETE, "max_tokens"))]
    assert said[0]["param"] == "max_new_tokens" and said[1]["param"] == "max_tokens"
    assert said[0]["code"] == said[1]["code"] == 422
    why = said[0]["message"].removeprefix("max_new_tokens").removeprefix(":").strip()
    assert said[1]["message"] == f"max_tokens: {why}", said


def test_a_sampling_setting_is_taken_where_the_route_s_default_samples(local):
    """/v1/completions samples by default (OpenAI's temperature 1): its top_k is read, not refused as unused,
    and is refused where the request asks for greedy (temperature 0), as the command line judges them."""
    body = {"model": "gen", "prompt": "the old fox", "max_tokens": 4, "top_k": 5}
    sampled = local.post("/v1/completions", json=body)
    greedy = local.post("/v1/completions", json={**body, "temperature": 0})
    assert sampled.status_code == 200 and sampled.json()["choices"][0]["seed"] is not None
    assert greedy.status_code == 422 and greedy.json()["error"]["param"] == "top_k"


def test_a_prompt_of_a_list_past_the_model_s_context_is_named_by_its_index(local):
    """Each prompt of a list is refused naming its index, as an empty one is (prompt.1), and the route's own
    name for the new tokens (max_tokens): the 413 used to name neither."""
    body = {"model": "gen", "prompt": ["the cat", "qzx " * 600], "max_tokens": 1000, "temperature": 0}
    answer = local.post("/v1/completions", json=body)
    assert answer.status_code == 413, answer.text
    error = answer.json()["error"]
    assert error["param"] == "max_seq_len"
    assert error["message"].startswith("prompt.1: the prompt of ")
    assert "plus max_tokens=1000" in error["message"]


GREEDY = {"model": "gen", "prompt": "the old fox", "max_new_tokens": 4, "seed": 3}


@pytest.mark.parametrize("body", [GREEDY, {**GREEDY, "num_beams": 2}])
def test_a_seed_to_a_decoding_that_draws_nothing_is_refused_as_the_command_line_does(server, body):
    """/generate: a seed without sampling would be ignored: 422 naming seed, the command line's words."""
    with server.client() as client:
        reply = client.post("/generate", json=body)
    assert reply.status_code == 422 and reply.json()["error"]["param"] == "seed"
    assert "seed=3 is read only when sampling" in reply.json()["error"]["message"]


def test_openai_s_route_takes_a_seed_with_temperature_0_as_openai_does(server):
    """lm-eval-harness sends seed with temperature 0 on every request: answered greedily, seed null."""
    body = {"model": "gen", "prompt": "the old fox", "max_tokens": 4, "temperature": 0}
    with server.client() as client:
        seeded, plain = (client.post("/v1/completions", json=b).json() for b in ({**body, "seed": 3}, body))
    assert seeded["choices"][0]["seed"] is None
    assert seeded["choices"][0]["text"] == plain["choices"][0]["text"]
