"""prefix_lm in the three faces (lmforge.generate's argument, `lmforge generate --prefix-lm`, the generation
routes' field), declared once by CallOptions: the server takes it and gives Python's tokens, and refuses a
bad value or an encoder-decoder with a 422 naming it, as Python refuses them; generate's speed settings,
which the server chooses itself, are refused by name saying so."""
from __future__ import annotations

import json

import pytest
import torch

import lmforge
from lmforge.config.options import OptionsError
from lmforge.generate.call_options import CALL_FIELDS
from lmforge.generate.text import prompt_ids
from lmforge.heads import attach
from tests.serve.conftest import _save, _tiny, _tokenizer

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from lmforge.serve.app import create_app  # noqa: E402
from lmforge.serve.models import load_served  # noqa: E402

PROMPTS = ("the old fox sat", "the cat", "the small dog sat on the mat", "a red bird near the river")
NEW = 6


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict:
    """A tiny decoder whose weights are scaled so that its attention, and so prefix_lm, decides its greedy
    tokens (at the init's scale the token's own embedding does), and a tiny T5."""
    root = tmp_path_factory.mktemp("prefix-lm")
    gpt, t5 = _tokenizer("gpt2"), _tokenizer("t5")
    decoder = _tiny("gpt2", gpt, 1, max_seq_len=64, d_model=64)
    attach(decoder, "lm")
    with torch.no_grad():
        for weight in decoder.parameters():
            if weight.dim() > 1:
                weight.mul_(3)
    seq2seq = _tiny("t5-small", t5, 2, max_seq_len=64)
    attach(seq2seq, "lm")
    return {"gen": _save(decoder, gpt, root / "gen"), "t5": _save(seq2seq, t5, root / "t5")}


@pytest.fixture(scope="module")
def client(dirs):
    """A client of the server's app on both models (one worker)."""
    with TestClient(create_app({n: load_served(n, d) for n, d in dirs.items()}, threads=1),
                    raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def python(dirs):
    """(prompt, prefix_lm) -> the new token ids lmforge.generate gives on the decoder's directory."""
    model, tokenizer = lmforge.load(dirs["gen"]), lmforge.load_tokenizer(dirs["gen"])

    def new_ids(prompt: str, prefix_lm: bool) -> list:
        ids = torch.tensor([prompt_ids(tokenizer, prompt, False)])
        out = lmforge.generate(model, ids, max_new_tokens=NEW, prefix_lm=prefix_lm)
        return out[0, ids.shape[1]:].tolist()
    return new_ids


@pytest.fixture(scope="module")
def prompt(python) -> str:
    """A prompt whose greedy tokens prefix_lm changes (so a server that ignored it would be seen)."""
    return next(p for p in PROMPTS if python(p, True) != python(p, False))


@pytest.mark.parametrize("route", ["/generate", "/v1/completions"])
def test_the_server_takes_prefix_lm_and_gives_python_s_tokens(client, python, prompt, route):
    """/generate refused prefix_lm ("Extra inputs are not permitted"), so a prefix LM's prompt was read
    causally by the server alone."""
    budget = {"max_new_tokens" if route == "/generate" else "max_tokens": NEW, "temperature": 0}
    body = {"model": "gen", "prompt": prompt, **budget}

    def new_ids(**given) -> list:
        answer = client.post(route, json={**body, **given})
        assert answer.status_code == 200, answer.text
        reply = answer.json()
        return reply["token_ids"] if route == "/generate" else reply["choices"][0]["token_ids"]
    assert new_ids(prefix_lm=True) == python(prompt, True) != python(prompt, False)
    assert new_ids(prefix_lm=False) == new_ids() == python(prompt, False)  # false: the default


def test_a_streamed_prefix_lm_reply_is_python_s_tokens_too(client, python, prompt):
    """Each streamed token and the last event's ids are Python's prefix-LM tokens."""
    body = {"model": "gen", "prompt": prompt, "max_new_tokens": NEW, "prefix_lm": True, "stream": True}
    with client.stream("POST", "/generate", json=body) as answer:
        events = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: {")]
    assert answer.status_code == 200
    streamed = [token for event in events[:-1] for token in event["token_ids"]]
    assert streamed == events[-1]["token_ids"] == python(prompt, True)


@pytest.mark.parametrize("value", ["yes", 1, 0, None, [True], 1.0])
@pytest.mark.parametrize("route", ["/generate", "/v1/completions"])
def test_a_bad_prefix_lm_is_a_422_naming_it_as_python_refuses_it(client, dirs, route, value):
    """Python refuses each (an OptionsError naming prefix_lm): so does the server, in one line."""
    model = lmforge.load(dirs["gen"])
    with pytest.raises(OptionsError) as python:
        lmforge.generate(model, torch.tensor([[5, 6]]), max_new_tokens=2, prefix_lm=value)
    answer = client.post(route, json={"model": "gen", "prompt": "the cat", "prefix_lm": value})
    error = answer.json()["error"]
    assert python.value.field == "prefix_lm" and answer.status_code == 422, answer.text
    assert error["param"] == "prefix_lm" and error["message"].startswith("prefix_lm: must be true or false")


@pytest.mark.parametrize("stream", [False, True])
def test_prefix_lm_for_an_encoder_decoder_is_a_422_naming_it_before_any_token(client, dirs, stream):
    """Python refuses it naming prefix_lm; the server refuses it before the job is queued, streamed too."""
    model = lmforge.load(dirs["t5"])
    with pytest.raises(OptionsError, match="prefix_lm is for decoders") as python:
        lmforge.generate(model, torch.tensor([[5, 6]]), max_new_tokens=2, prefix_lm=True)
    body = {"model": "t5", "prompt": "the cat", "max_new_tokens": 2, "prefix_lm": True, "stream": stream}
    answer = client.post("/generate", json=body)
    assert python.value.field == "prefix_lm" and answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["param"] == "prefix_lm" and "prefix_lm is for decoders" in error["message"]


@pytest.mark.parametrize("route", ["/generate", "/v1/completions"])
@pytest.mark.parametrize("name, value", [("use_cache", False), ("projection", "plain")])
def test_generate_s_speed_settings_are_refused_by_name_saying_why(client, route, name, value):
    """Python's use_cache and projection give the same tokens; the server picks its fast path itself, so
    they are refused naming the field and why (/generate said only "Extra inputs are not permitted",
    /v1/completions ignored them unsaid)."""
    answer = client.post(route, json={"model": "gen", "prompt": "the cat", name: value})
    error = answer.json()["error"]
    assert answer.status_code == 422 and error["param"] == name, answer.text
    assert "speed setting of lmforge.generate" in error["message"] and "Extra inputs" not in error["message"]


def test_the_spec_and_the_command_line_say_prefix_lm_as_call_options_declares_it(client, capsys):
    """One definition: the request schemas' prefix_lm and --prefix-lm's help are CallOptions' field."""
    from lmforge.cli import main

    declared = CALL_FIELDS["prefix_lm"]
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for request in ("GenerateRequest", "CompletionRequest"):
        prop = schemas[request]["properties"]["prefix_lm"]
        assert prop["description"] == declared.metadata["help"] and prop["default"] is declared.default
        assert prop["type"] == "boolean"
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert " ".join(declared.metadata["help"].split()[:6]) in " ".join(capsys.readouterr().out.split())


def test_the_command_line_s_prefix_lm_prints_python_s_text(dirs, python, prompt, capsys):
    """`lmforge generate --prefix-lm` prints the prompt and Python's prefix-LM continuation."""
    from lmforge.cli import main
    from lmforge.generate.text import continuation

    tokenizer = lmforge.load_tokenizer(dirs["gen"])
    argv = ["generate", "--model", str(dirs["gen"]), prompt, "--max-new-tokens", str(NEW), "--prefix-lm"]
    assert main(argv) == 0
    context = prompt_ids(tokenizer, prompt, False)
    assert capsys.readouterr().out == prompt + continuation(tokenizer, context, python(prompt, True)) + "\n"


def test_the_command_line_refuses_prefix_lm_for_an_encoder_decoder_naming_the_flag(dirs, capsys):
    """It said Python's words alone ("prefix_lm is for decoders"), not the flag, as its other refusals do."""
    from lmforge.cli import main

    assert main(["generate", "--model", str(dirs["t5"]), "the cat", "--prefix-lm"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "error: --prefix-lm: prefix_lm is for decoders" in err
