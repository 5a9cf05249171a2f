"""The `lmforge` entry point: every usage error is one line on stderr with exit status 2."""
import pytest

from lmforge.cli import main, one_line


@pytest.mark.parametrize("argv, message", [
    (["quantize", "--model", "m", "--out", "o", "--mode", "int4"],
     "--mode int4: not one of dynamic, weight-only"),
    (["prune", "--sparsity", "abc"], "--sparsity abc: must be a number"),
    (["no-such-job"], "no-such-job: no such command (one of inspect, convert,"),
    ([], "the following arguments are required: command"),
])
def test_argument_errors_are_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and err.count("\n") == 1 and "usage:" not in err


def test_multi_line_errors_are_joined(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("a: [1\nb: 2\n")
    assert main(["inspect", "bert-tiny", "--config", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmforge inspect: error: cannot read config file") and err.count("\n") == 1
    assert one_line("a\n  b\tc ") == "a b c"
