"""`lmforge serve` refuses bad input in one line naming the option, with exit status 2, before serving."""
from __future__ import annotations

import socket

import pytest
import torch

from lmforge.cli import build_parser, main


@pytest.mark.parametrize("argv, option", [
    (["--model", "/no/such/dir", "--port", "0"], "--model /no/such/dir"),
    (["--model", "x", "--port", "70000"], "--port 70000"),
    (["--model", "x", "--max-queue", "0"], "--max-queue 0"),
    (["--model", "x", "--batch-wait-ms", "nan"], "--batch-wait-ms nan"),
    (["--model", "x", "--threads", "0"], "--threads 0"),
    (["--model", "x", "--threads", "100000"], "--threads 100000"),  # was 10^5 workers, then a crash
    (["--model", "x", "--threads", "1", "--workers", "2"], "--workers 2"),
    (["--model", "x", "--graceful-timeout", "inf"], "--graceful-timeout inf: seconds in (0, 3600]"),
    (["--model", "x", "--graceful-timeout", "nan"], "--graceful-timeout nan: seconds in (0, 3600]"),
    (["--model", "x", "--workers", "0"], "--workers 0"),
    (["--model", "a=x", "--model", "a=y"], "--model 'a=y'"),
    (["--model", "x", "--host", "no.such.host.invalid"], "--host no.such.host.invalid"),
])
def test_bad_input_is_a_one_line_error_naming_the_option(capsys, argv, option):
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmforge serve: error: ") and option in err and err.count("\n") == 1, err


def test_a_taken_port_is_refused_before_loading(capsys, model_dirs):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "--model", str(model_dirs["enc"]), "--port", str(port)]) == 2
    assert f"--port {port}: cannot listen" in capsys.readouterr().err


def test_help_lists_every_limit():
    help_text = build_parser().parse_args(["serve", "--model", "x"]).func.__doc__
    usage = [a for a in build_parser()._subparsers._group_actions[0].choices["serve"]._actions]
    flags = {f for a in usage for f in a.option_strings}
    assert help_text and {"--max-batch-tokens", "--max-queue", "--max-body-bytes", "--max-new-tokens",
                          "--batch-wait-ms", "--graceful-timeout", "--threads", "--workers"} <= flags


def test_only_the_serve_command_line_itself_restarts(monkeypatch):
    # a restart runs sys.orig_argv again: a program calling main(["serve", ...]) in-process (this test
    # suite, a notebook) must not be replaced by a second run of itself
    from lmforge.cli.serve import started_as

    argv = ["serve", "--model", "x", "--port", "0"]
    args = build_parser().parse_args(argv)
    assert not started_as(args)  # sys.argv is pytest's
    monkeypatch.setattr("sys.argv", ["lmforge", *argv])
    assert started_as(args)
    assert not started_as(build_parser().parse_args([*argv, "--malloc", "glibc"]))
    monkeypatch.setattr("sys.argv", ["lmforge", "serve", "--no-such-option"])
    assert not started_as(args)


def test_the_python_face_bounds_threads_and_workers_as_the_command_line_does(model_dirs):
    from lmforge.config.options import OptionsError
    from lmforge.serve.app import Server
    from lmforge.serve.models import load_served

    served, threads_before = {"enc": load_served("enc", model_dirs["enc"])}, torch.get_num_threads()
    for threads, workers, field in ((10**5, None, "threads"), (0, None, "threads"), (1, 2, "workers")):
        with pytest.raises(OptionsError) as refused:
            Server(served, threads=threads, workers=workers)
        assert refused.value.field == field
    assert Server(served, threads=1, workers=1).n_workers == 1
    torch.set_num_threads(1)  # no threads given: the workers share torch's, here one
    try:
        with pytest.raises(OptionsError, match=r"workers=2: must be between 1 and the threads \(1\)"):
            Server(served, workers=2)
    finally:
        torch.set_num_threads(threads_before)
