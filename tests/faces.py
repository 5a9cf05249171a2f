"""Shared by the tests that drive one options object through its three faces (Python, the command
line, the server): a time bound on each call, and the command line's verdict on a request."""
from __future__ import annotations

import contextlib
import io
import time

SECONDS = 5.0  # no face may take longer on one request (issue 41: no hang over 5 s)


def timed(call, seconds: float = SECONDS):
    """call(), asserting it took less than `seconds`."""
    start = time.monotonic()
    out = call()
    assert time.monotonic() - start < seconds, f"took {time.monotonic() - start:.1f} s"
    return out


def cli_verdict(argv: list, request: dict, text=str):
    """None when `lmforge argv --name=value ...` (the request's settings as flags) succeeds, else its one
    error line; a refusal must be exit status 2, one line on standard error, nothing on standard output."""
    from lmforge.cli import main

    argv = [*argv, *(f"--{name.replace('_', '-')}={text(value)}" for name, value in request.items())]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = timed(lambda: main(argv))
        except SystemExit as exit_:  # argparse's own refusals
            status = exit_.code
    if status == 0:
        return None
    assert status == 2 and out.getvalue() == "", (status, out.getvalue())
    line = err.getvalue()
    assert line.count("\n") == 1 and "Traceback" not in line, line
    return line


def server_verdict(client, route: str, body: dict):
    """(None, the answer's JSON) when POST `route` with `body` succeeds, else (its refusal as "param:
    message", None); a refusal must be 413 or 422 (NaN and Infinity go as Python writes them)."""
    import json

    answer = timed(lambda: client.post(route, content=json.dumps(body),
                                       headers={"content-type": "application/json"}))
    if answer.status_code == 200:
        return None, answer.json()
    assert answer.status_code in (413, 422), answer.text[:300]
    error = answer.json()["error"]
    return f"{error['param']}: {error['message']}", None
