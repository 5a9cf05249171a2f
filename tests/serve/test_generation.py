"""The generation job (serve/generation.py): what a reply's text, token ids and counts say of each other."""
from __future__ import annotations

import json
import shutil

import pytest
from fastapi.testclient import TestClient

import lmforge
from lmforge.generate.text import continuation, prompt_ids
from lmforge.serve import create_app, load_served


@pytest.mark.parametrize("beams", [1, 3])
def test_a_stop_string_ends_the_token_ids_where_it_ends_the_text(local, model_dirs, beams):
    """Stopped by a stop string, a reply's token_ids (and completion_tokens) are the fewest ids whose text
    holds it, with beam search as with greedy: not the whole beam, whose text goes on past the stop."""
    tokenizer, body = lmforge.load_tokenizer(model_dirs["gen"]), {"model": "gen", "prompt": "the old fox",
                                                                    "max_new_tokens": 12, "num_beams": beams}
    whole = local.post("/generate", json=body).json()
    stop = whole["text"][3:7]
    stopped = local.post("/generate", json={**body, "stop": stop}).json()
    ids, start = stopped["token_ids"], prompt_ids(tokenizer, body["prompt"], False)
    assert stopped["finish_reason"] == "stop" and stop in whole["text"]
    assert stop in continuation(tokenizer, start, ids) and \
        stop not in continuation(tokenizer, start, ids[:-1])
    assert stopped["usage"]["completion_tokens"] == len(ids) < len(whole["token_ids"])


def test_a_v1_completions_refusal_says_max_tokens_the_field_it_takes(local, model_dirs, tmp_path):
    """/v1/completions takes max_tokens and refuses max_new_tokens by name, so its refusals say max_tokens:
    they said max_new_tokens (a checkpoint's max_length the prompt reaches told the client to "give
    max_new_tokens", which the route then refused); /generate keeps its own name."""
    body = {"model": "gen", "prompt": "the old fox", "max_tokens": 3, "temperature": 0}
    fewer = local.post("/v1/completions", json={**body, "min_new_tokens": 5}).json()["error"]
    assert fewer["param"] == "min_new_tokens" and "max_tokens=3" in fewer["message"]
    assert "max_new_tokens" not in fewer["message"]
    shutil.copytree(model_dirs["gen"], tmp_path / "gen")
    (tmp_path / "gen" / "generation_config.json").write_text(json.dumps({"max_length": 2}))
    app = create_app({"gen": load_served("gen", tmp_path / "gen")}, threads=1)
    with TestClient(app, raise_server_exceptions=False) as client:
        prompt = {"model": "gen", "prompt": "the old fox", "temperature": 0}
        reached = client.post("/v1/completions", json=prompt)
        own = client.post("/generate", json=prompt).json()["error"]
        given = client.post("/v1/completions", json={**prompt, "max_tokens": 2})
    assert reached.status_code == 422 and reached.json()["error"]["param"] == "max_tokens"
    assert reached.json()["error"]["message"].endswith("give max_tokens")
    assert own["param"] == "max_new_tokens" and own["message"].endswith("give max_new_tokens")
    assert given.status_code == 200 and given.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("recommended", [{"max_length": 2}, {"do_sample": "yes"}])
def test_a_refusal_of_the_checkpoint_s_settings_does_not_say_the_server_s_paths(model_dirs, tmp_path,
                                                                             recommended):
    """A refusal naming the served model's generation_config.json calls it so, not by the directory the server
    loaded it from, which /info keeps from clients too (it said the path), whether the file's values do not
    fit the prompt or fail their check."""
    shutil.copytree(model_dirs["gen"], tmp_path / "gen")
    (tmp_path / "gen" / "generation_config.json").write_text(json.dumps(recommended))
    with TestClient(create_app({"gen": load_served("gen", tmp_path / "gen")}, threads=1),
                    raise_server_exceptions=False) as client:
        error = client.post("/generate", json={"model": "gen", "prompt": "the old fox"}).json()["error"]
    assert error["code"] == 422 and "generation_config.json" in error["message"]
    assert str(tmp_path) not in error["message"] and "the served model's" in error["message"]


def test_a_reply_not_streamed_and_without_stops_is_decoded_once_not_at_every_step(local, monkeypatch):
    """Nothing is shown per step where the reply is not streamed: with no stop string to seek, its text is
    decoded once at the end (generate_until_stop's fast path), not token by token through the streamer."""
    from lmforge.generate.text import Continuation

    body = {"model": "gen", "prompt": "the old fox", "max_new_tokens": 8, "temperature": 0}
    before = local.post("/generate", json=body).json()
    pushes = []
    push = Continuation.push
    monkeypatch.setattr(Continuation, "push", lambda self, token: pushes.append(token) or push(self, token))
    reply = local.post("/generate", json=body).json()
    assert pushes == [] and reply["text"] == before["text"] and reply["token_ids"] == before["token_ids"]
    streamed = local.post("/generate", json={**body, "stream": True})
    assert len(pushes) == len(reply["token_ids"]) and streamed.status_code == 200
