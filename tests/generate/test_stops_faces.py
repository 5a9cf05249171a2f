"""Stop strings through the faces built on generate/stops.py: `lmforge generate --stop` and the server's
`stop` (/generate, /v1/completions) refuse the same values in the same words, and give the same text,
streamed or not."""
from __future__ import annotations

import json

import pytest

from lmforge.config.options import OptionsError
from lmforge.generate.stops import MAX_STOP, MAX_STOP_CHARS, check_stops
from tests.faces import cli_verdict, server_verdict

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from lmforge.serve.app import create_app  # noqa: E402
from lmforge.serve.models import load_served  # noqa: E402

PROMPT = "the cat"


@pytest.fixture(scope="module")
def faces(tmp_path_factory):
    """(model directory, a client of the server's app on that model)."""
    from tests.tasks.core import saved_lm

    path = saved_lm(tmp_path_factory.mktemp("stops") / "gen")
    with TestClient(create_app({"gen": load_served("gen", path)}, threads=1)) as client:
        yield path, client


def _cli(path, stops: list, *flags: str):
    """None when accepted, else the one error line."""
    argv = ["generate", "--model", str(path), PROMPT, "--max-new-tokens", "2", *flags]
    return cli_verdict([*argv, *(f"--stop={stop}" for stop in stops)], {})


@pytest.mark.parametrize("stops", [[""], ["a", ""], ["a"] * (MAX_STOP + 1), ["a", "x" * (MAX_STOP_CHARS + 1)],
                                   ["a"] * MAX_STOP, ["x" * MAX_STOP_CHARS], ["\n", " the"]],
                         ids=["empty", "second-empty", "too-many", "too-long", "most", "longest", "two"])
def test_the_command_line_and_the_server_refuse_the_same_stops_in_the_same_words(faces, stops):
    """The same words, a bound's too (the server adds its setting's name, which the command line, without
    such a setting, does not say)."""
    path, client = faces
    try:
        check_stops(stops)
        said = None
    except OptionsError as err:
        said = str(err)
    cli = _cli(path, stops)
    for route, tokens in (("/generate", "max_new_tokens"), ("/v1/completions", "max_tokens")):
        server, _ = server_verdict(client, route, {"model": "gen", "prompt": PROMPT, tokens: 2, "stop": stops,
                                                   "temperature": 0})
        assert (server is None) == (cli is None) == (said is None), (route, server, cli)
        if said is not None:
            assert said in server and said in cli and "--stop" in cli, (server, cli)
            assert "max_stop" not in cli, cli


def _streamed(client, body: dict) -> str:
    with client.stream("POST", "/generate", json={**body, "stream": True}) as answer:
        assert answer.status_code == 200
        events = [json.loads(line[6:]) for line in answer.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    return "".join(event.get("text") or "" for event in events[:-1])


def test_the_command_line_and_the_server_give_the_same_text_streamed_or_not(faces):
    path, client = faces
    body = {"model": "gen", "prompt": PROMPT, "max_new_tokens": 16}
    whole = client.post("/generate", json=body).json()["text"]
    stop = whole[8:11]
    answer = client.post("/generate", json={**body, "stop": [stop]}).json()
    assert answer["finish_reason"] == "stop" and answer["text"] == whole[:whole.index(stop)] != ""
    assert _streamed(client, {**body, "stop": [stop]}) == answer["text"]
    for stream in ([], ["--stream"]):
        printed = _printed(path, ["--max-new-tokens", "16", "--stop", stop, *stream])
        assert printed == PROMPT + answer["text"] + "\n"


def _printed(path, flags: list) -> str:
    import contextlib
    import io

    from lmforge.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["generate", "--model", str(path), PROMPT, *flags]) == 0
    return out.getvalue()
