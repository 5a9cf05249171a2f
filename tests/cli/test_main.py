"""The `lmforge` entry point: every usage error is one line on stderr with exit status 2; an empty path
is one."""
import pytest

from lmforge.cli import main, one_line


@pytest.mark.parametrize("argv, message", [
    (["quantize", "--model", "m", "--out", "o", "--mode", "int4"],
     "--mode int4: not one of dynamic, weight-only"),
    (["prune", "--sparsity", "abc"], "--sparsity abc: must be a number"),
    (["no-such-job"], "no-such-job: no such command (one of inspect, convert,"),
    # the reference's name: was "did you mean --min-length?", the opposite bound
    (["generate", "--model", "m", "x", "--max-length", "5"], "did you mean --max-new-tokens?"),
    # the same name spelt as the reference's keyword: was --min-length too (flags read as option names now)
    (["generate", "--model", "m", "x", "--max_length", "5"], "did you mean --max-new-tokens?"),
    ([], "lmforge: error: give a command: inspect, convert, presets,"),  # was "required: command"
    (["tokenizer"], "lmforge tokenizer: error: give a command: train (see"),  # was "required: action"
    (["index"], "lmforge index: error: give a command: build (see"),
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


@pytest.mark.parametrize("argv, said", [
    # Path("") is the working folder: a run wrote its checkpoints, tokenizer or index into it, exit 0
    (["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", ""], "--out"),
    (["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "100", "--out", " "], "--out"),
    (["index", "build", "--passages", "", "--out", "ix"], "--passages"),
    (["pretrain", "--preset", "p", "--objective", "mlm", "--data", "a.txt", "", "--out", "o"], "--data"),
    (["convert", "", "out", "--to", "hf"], "SRC"),
    (["inspect", ""], "MODEL"),
    # or the flag left out: a run without validation, tokenizer, calibration or reader, exit 0
    (["finetune", "--model", "m", "--train", "t.jsonl", "--valid", "", "--out", "o"], "--valid"),
    (["pretrain", "--preset", "p", "--objective", "mlm", "--tokenizer", "", "--out", "o"], "--tokenizer"),
    (["quantize", "--model", "m", "--calibration", "", "--out", "o"], "--calibration"),
    (["retrieve", "--index", "ix", "--query", "q", "--reader", ""], "--reader"),
    (["index", "build", "--model", "", "--out", "ix"], "--model"),
])
def test_an_empty_path_is_refused_naming_its_argument(capsys, tmp_path, monkeypatch, argv, said):
    monkeypatch.chdir(tmp_path)  # a run that wrote into the working folder would show here
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: {said} is empty: name a file, folder or model" in err, err
    assert not list(tmp_path.iterdir())


def test_an_empty_text_that_is_no_path_is_kept():
    """Texts may be empty (an empty prompt prefix, a query): only paths are refused."""
    from lmforge.cli import build_parser

    args = build_parser().parse_args(["embed", "--model", "m", "--prompt", "", "a"])
    assert args.prompt == "" and args.texts == ["a"]


def test_a_bad_value_from_a_config_file_names_the_file(tmp_path, capsys):
    """A value refused as it came from --config says the file to mend; one given as key=value (which wins
    over the file) is said as it was, without it."""
    config = tmp_path / "run.yaml"
    config.write_text("steps: [1, 2]\nlr: 0.1\n")
    base = ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(tmp_path / "o"),
            "--config", str(config)]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "steps must be an integer" in err and f"(from --config {config})" in err
    assert main([*base, "steps=0"]) == 2
    err = capsys.readouterr().err
    assert "steps must be an integer >= 1" in err and "--config" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("job", [["pretrain", "--preset", "bert-tiny", "--objective", "mlm"],
                                 ["finetune", "--builtin", "sentiment", "--model", "bert-tiny"]])
def test_a_key_given_twice_in_a_config_file_is_one_line_naming_the_file_the_key_and_its_lines(
        job, tmp_path, capsys):
    """It said PyYAML's marks: 'in "<unicode string>", line 2, column 1: lr: 0.002 ^'."""
    config = tmp_path / "run.yaml"
    config.write_text("lr: 0.001\nsteps: 5\nlr: 0.002\n")
    assert main([*job, "--out", str(tmp_path / "o"), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unicode" not in err and "^" not in err, err
    assert err.rstrip().endswith(f"cannot read config file {config}: key 'lr' given twice (lines 1 and 3)")
