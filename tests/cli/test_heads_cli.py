"""`lmforge heads` checks --out and --step on every run, before any work (it always writes heads.json)."""
import pytest

from lmforge.cli import main


@pytest.fixture
def model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a run that wrote into the working directory would show here
    (tmp_path / "model").mkdir()
    (tmp_path / "afile").write_text("x")
    return tmp_path / "model"


@pytest.mark.parametrize("flags, words", [
    (["--out", ""], "--out is empty"),
    (["--out", "afile"], "--out afile: exists and is not a folder"),
    (["--out", "model"], "--out model is the input --model model: "),
    (["--out", "o", "--step", "0"], "--step 0: a fraction of the heads masked per level, in (0, 1)"),
    (["--out", "o", "--step", "1"], "--step 1: a fraction"),  # as typed, not 1.0
])
def test_a_run_without_prune_refuses_bad_out_and_step_up_front(model, capsys, flags, words):
    assert main(["heads", "--model", "model", "--data", "missing.jsonl", "--task", "cls", *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and words in err and "Errno" not in err, err
    assert sorted(p.name for p in model.parent.iterdir()) == ["afile", "model"]  # nothing written
    assert (model.parent / "afile").read_text() == "x"


@pytest.mark.parametrize("fields, flags, field", [
    ({"step": 1.0}, ["--step", "1"], "step"),
    ({"prune": 1.5}, ["--prune", "1.5"], "prune"),
    ({"until": 0.0}, ["--until", "0"], "until"),
    ({"prune": float("nan")}, ["--prune", "nan"], "prune"),
    ({"prune": 0.3, "until": 0.9}, ["--prune", "0.3", "--until", "0.9"], "until"),
])
def test_python_and_the_command_line_refuse_the_same_heads_options(model, capsys, fields, flags, field):
    from lmforge.analysis.head_report import HeadsOptions
    from lmforge.config.options import OptionsError

    with pytest.raises(OptionsError) as refused:
        HeadsOptions(**fields)
    assert refused.value.field == field
    assert main(["heads", "--model", "model", "--data", "missing.jsonl", "--task", "cls", "--out", "o",
                 *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (f"--{field}" in err or "not both" in err), err
    assert sorted(p.name for p in model.parent.iterdir()) == ["afile", "model"]  # nothing written


def test_heads_options_the_command_line_builds_are_the_ones_run_heads_gets():
    import lmforge.analysis.head_report as report
    from lmforge.cli import build_parser
    from lmforge.cli.analysis import heads_options

    args = build_parser().parse_args(["heads", "--model", "m", "--data", "d", "--out", "o", "--until", "0.9",
                                      "--step", "0.25", "--seed", "7", "--random-orders", "2",
                                      "--batch-size", "8"])
    options = heads_options(args)
    assert options == report.HeadsOptions(until=0.9, step=0.25, seed=7, random_orders=2, batch_size=8)
    curve = options.curve()
    assert (curve.order, curve.step, curve.until, curve.seed) == ("importance", 0.25, 0.9, 7)
    assert curve.batch_size == 8


@pytest.mark.parametrize("flag, typed", [("--until", "1e400"), ("--prune", "1e400"), ("--step", "-0.0")])
def test_a_bad_number_is_quoted_as_typed_not_as_parsed(model, capsys, flag, typed):
    """--until 1e400 was said as --until inf: the error quotes what the user wrote."""
    assert main(["heads", "--model", "model", "--data", "missing.jsonl", "--task", "cls", "--out", "o", flag,
                 typed]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} {typed}: " in err and "inf" not in err, err
