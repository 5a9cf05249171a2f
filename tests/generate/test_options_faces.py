"""One request, checked once: random generation settings, in range or not, of the right type or not, go
through the three faces (lmforge.generate, `lmforge generate`, POST /generate) built from GenerationOptions,
and the three accept and refuse alike, each refusal in its own clean form naming the setting, none slow."""
from __future__ import annotations

import math
from datetime import timedelta

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmforge
from lmforge.config.options import OptionsError
from lmforge.generate.options import GenerationOptions, sampling_from_temperature
from tests.faces import SECONDS, cli_verdict, server_verdict, timed

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from lmforge.serve.app import create_app  # noqa: E402
from lmforge.serve.models import load_served  # noqa: E402

PROMPT = "the cat"
NAN, INF = float("nan"), float("inf")
# never a number's text: the CLI reads text
WRONG = st.sampled_from(["abc", "", True, False, None, [1], {"a": 1}])


def _ints(valid: st.SearchStrategy, invalid: list) -> st.SearchStrategy:
    return st.one_of(valid, valid, st.sampled_from(invalid), st.integers(-10**12, -1), WRONG,
                     st.sampled_from([2.5, NAN, INF]))


def _floats(valid: st.SearchStrategy, invalid: list) -> st.SearchStrategy:
    return st.one_of(valid, valid, st.sampled_from([NAN, INF, -INF, 1e300, *invalid]), WRONG)


def _unit(low: float, high: float) -> st.SearchStrategy:
    return st.floats(low, high, allow_nan=False, allow_infinity=False).map(lambda x: round(x, 3))


# the generation settings the three faces share; accepted draws stay small (a short, cheap generation)
FIELDS = {
    "max_new_tokens": _ints(st.integers(1, 6), [0, 4097, 10**9]),
    "min_new_tokens": _ints(st.integers(0, 8), [4097, 10**6]),
    "temperature": _floats(st.sampled_from([0, 0.0, 0.5, 1, 1.5]), [-1.0, -1e-9, 100.5]),
    "top_k": _ints(st.integers(0, 40), [301, 5000, 10**7]),  # 301..: past the vocabulary of 300
    "top_p": _floats(_unit(0.05, 1.0), [0.0, -0.5, 1.5]),
    "num_beams": _ints(st.integers(1, 3), [0, 65, 10**6]),
    "length_penalty": _floats(_unit(-2.0, 2.0), [100.5, -1e4]),
    "repetition_penalty": _floats(_unit(0.5, 2.0), [0.0, -1.0, 101.0]),
    "no_repeat_ngram_size": _ints(st.integers(0, 3), [65, 10**5]),
}
REQUESTS = st.fixed_dictionaries({}, optional=FIELDS)


@pytest.fixture(scope="module")
def faces(tmp_path_factory):
    """(model directory, loaded model, prompt ids, a client of the server's app on that model)."""
    from tests.tasks.core import saved_lm, tokenizer

    path, tok = saved_lm(tmp_path_factory.mktemp("faces") / "gen"), tokenizer("gpt2")
    ids = torch.tensor([tok.encode(PROMPT, add_special_tokens=False).ids])
    with TestClient(create_app({"gen": load_served("gen", path)}, threads=1)) as client:
        yield path, lmforge.load(path), ids, client


_timed = timed


def _python(model, ids, request: dict):
    """None when accepted, else the refusal's field (an OptionsError, a ValueError)."""
    try:
        _timed(lambda: lmforge.generate(model, ids, **sampling_from_temperature(request)))
    except OptionsError as err:
        assert "\n" not in str(err) and err.field in str(err)
        return err.field
    return None


def _text(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _cli(path, request: dict):
    """None when accepted, else the one error line (exit status 2, nothing on standard output)."""
    return cli_verdict(["generate", "--model", str(path), PROMPT], request, _text)


def _server(client, request: dict):
    """None when accepted, else the error's message (413 or 422, naming the setting)."""
    refusal, answer = server_verdict(client, "/generate", {"model": "gen", "prompt": PROMPT, **request})
    assert refusal is not None or answer["token_ids"] is not None
    return refusal


@settings(max_examples=40, deadline=timedelta(seconds=3 * SECONDS),
          suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(request=REQUESTS)
def test_the_three_faces_accept_and_refuse_alike(faces, request):
    path, model, ids, client = faces
    python, cli, server = _python(model, ids, request), _cli(path, request), _server(client, request)
    verdicts = {"python": python is None, "cli": cli is None, "server": server is None}
    assert len(set(verdicts.values())) == 1, (request, python, cli, server)
    if python is not None:  # each refusal names a setting of the request
        assert python in request, (request, python)
        assert any(f"--{name.replace('_', '-')}" in cli for name in request), (request, cli)
        assert any(name in server for name in request), (request, server)


def test_the_issue_s_three_requests_are_refused_everywhere(faces):
    path, model, ids, client = faces
    for request, field in (({"temperature": -1}, "temperature"), ({"min_new_tokens": 9, "max_new_tokens": 3},
                                                                  "min_new_tokens"), ({"num_beams": 10**6},
                                                                                      "num_beams")):
        assert _python(model, ids, request) == field
        assert f"--{field.replace('_', '-')}" in _cli(path, request)
        assert field in _server(client, request)


def test_the_schema_carries_the_options_bounds_and_help(faces):
    spec = faces[3].get("/openapi.json").json()["components"]["schemas"]["GenerateRequest"]["properties"]
    declared = {f.name: f.metadata for f in __import__("dataclasses").fields(GenerationOptions)}
    for name in FIELDS:
        meta, prop = declared[name], spec[name]
        assert prop["description"].startswith(meta["help"])
        low_key = "exclusiveMinimum" if meta["open_low"] else "minimum"
        assert prop.get(low_key) == meta["low"] and prop.get("maximum") == meta["high"]
    assert math.isclose(spec["temperature"]["default"], 0.0)  # the server's convention: 0 is greedy


# min_length counts the whole decoder sequence, prompt included (HF's): start + max_new_tokens is the
# longest text the budget allows, so a min_length past it could never let the text end, as a min_new_tokens
# past max_new_tokens could not. (request, refused), start being the prompt's tokens
MIN_LENGTHS = [(lambda start: {"min_length": start + 3, "max_new_tokens": 3}, False),
               (lambda start: {"min_length": start + 4, "max_new_tokens": 3}, True),
               (lambda start: {"min_length": 2 ** 20, "max_new_tokens": 3}, True)]


@pytest.mark.parametrize("start, max_new", [(1, 1), (1, 7), (4, 3), (30, 1)])
def test_a_min_length_is_refused_exactly_where_prompt_and_budget_cannot_reach_it(start, max_new):
    """The same boundary as min_new_tokens' (equal to the budget: served; one past it: refused)."""
    GenerationOptions(max_new_tokens=max_new, min_length=start + max_new).check_start(start)
    GenerationOptions(max_new_tokens=max_new, min_new_tokens=max_new)
    for fields in ({"min_length": start + max_new + 1}, {"min_new_tokens": max_new + 1}):
        with pytest.raises(OptionsError, match="no text could end before the budget") as err:
            GenerationOptions(max_new_tokens=max_new, **fields).check_start(start)
        assert err.value.field in fields and "\n" not in str(err.value)


def test_an_unreachable_min_length_is_refused_by_python_and_the_command_line(faces):
    path, model, ids, _ = faces
    for make, refused in MIN_LENGTHS:
        request = make(ids.shape[1])
        assert _python(model, ids, request) == ("min_length" if refused else None), request
        cli = _cli(path, request)
        assert (cli is not None) == refused, (request, cli)
        assert not refused or ("--min-length" in cli and "no text could end before the budget" in cli), cli


def test_an_unreachable_min_length_is_refused_by_the_server(faces):
    *_, ids, client = faces
    for make, refused in MIN_LENGTHS:
        server = _server(client, make(ids.shape[1]))
        assert (server is not None) == refused, server
        assert not refused or server.startswith("min_length: "), server


def test_a_checkpoint_s_max_length_is_python_s_with_start_as_the_command_line_s_else_said(faces, tmp_path,
                                                                                         capsys):
    """GenerationOptions.load(DIR) dropped a generation_config.json's max_length unsaid (it counts the
    prompt, which load cannot know): Python generated 20 new tokens where `lmforge generate` generated
    max_length less the prompt. Given start=, Python prints the command line's text; without it, a
    GenerationWarning says so."""
    import json
    import shutil

    from lmforge.cli import main
    from lmforge.generate.checks import GenerationWarning
    from lmforge.generate.text import continuation, tokenizer_ids

    path, model, ids, _ = faces
    copy = tmp_path / "gen"
    shutil.copytree(path, copy)
    (copy / "generation_config.json").write_text(json.dumps({"max_length": ids.shape[1] + 3}))
    assert main(["generate", "--model", str(copy), PROMPT]) == 0
    printed = capsys.readouterr().out
    options, tok = GenerationOptions.load(copy, start=ids.shape[1]), lmforge.load_tokenizer(copy)
    assert options.max_new_tokens == 3
    new = lmforge.generate(model, ids, options=options, **tokenizer_ids(model, tok))[0, ids.shape[1]:]
    assert printed == PROMPT + continuation(tok, ids[0].tolist(), new.tolist()) + "\n"
    said = rf"max_length={ids.shape[1] + 3}, .*not applied without start="
    with pytest.warns(GenerationWarning, match=said):
        assert GenerationOptions.load(copy).max_new_tokens == 20


def test_beams_that_would_stream_are_refused_on_every_face_python_naming_num_beams(faces):
    """Python raised a bare ValueError naming no field where the command line names --num-beams (the
    server's streams refuse it too, naming stream, its own switch)."""
    path, model, ids, client = faces
    with pytest.raises(OptionsError, match="num_beams=2 with a streamer") as refused:
        lmforge.generate(model, ids, num_beams=2, streamer=lambda chosen: None)
    assert refused.value.field == "num_beams" and "\n" not in str(refused.value)
    argv = ["generate", "--model", str(path), PROMPT, "--stream"]
    assert "--num-beams 2" in cli_verdict(argv, {"num_beams": 2})
    assert _server(client, {"num_beams": 2, "stream": True}).startswith("stream: ")


def test_a_checkpoint_s_settings_lmforge_does_not_apply_are_said_not_dropped(faces, tmp_path):
    """A generation_config.json's bad_words_ids or num_beam_groups was dropped unsaid by the command line and
    by GenerationOptions.load (the banned token generated, diverse beam search run as plain beam search); now
    a GenerationWarning names them, and not a setting stated at the value that changes nothing."""
    import json
    import shutil

    from lmforge.cli import main
    from lmforge.generate.checks import GenerationWarning

    path = tmp_path / "gen"
    shutil.copytree(faces[0], path)
    (path / "generation_config.json").write_text(json.dumps(
        {"bad_words_ids": [[33]], "num_beam_groups": 2, "typical_p": 1.0, "num_beams": 2}))
    said = r"recommends bad_words_ids=\[\[33\]\], num_beam_groups=2, which lmforge does not apply"
    with pytest.warns(GenerationWarning, match=said) as caught:
        assert GenerationOptions.load(path).num_beams == 2
    assert "typical_p" not in str(caught[0].message)
    with pytest.warns(GenerationWarning, match=said):
        assert main(["generate", "--model", str(path), PROMPT, "--max-new-tokens", "2"]) == 0


def test_an_explicit_min_new_tokens_of_0_is_given_and_replaces_another_min_length(faces, tmp_path):
    """min_new_tokens=0 was the default, so it could not override a checkpoint's min_length (the reference's
    explicit min_new_tokens replaces it); now unset is None and 0 is a value, alike in the three faces."""
    import json

    assert GenerationOptions().min_new_tokens is None
    replaced = GenerationOptions.build(GenerationOptions(min_length=9), {"min_new_tokens": 0})
    assert (replaced.min_length, replaced.min_new_tokens) == (0, 0)
    (tmp_path / "generation_config.json").write_text(json.dumps({"min_length": 9, "min_new_tokens": 2}))
    assert "min_length" not in GenerationOptions.recommended(tmp_path)  # the reference reads it alone
    path, model, ids, client = faces
    both = {"min_new_tokens": 0, "min_length": ids.shape[1] + 2, "max_new_tokens": 4}  # given together
    assert _python(model, ids, both) == "min_length"
    assert "--min-length" in _cli(path, both) and _server(client, both).startswith("min_length: ")
