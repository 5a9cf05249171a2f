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
    (["--out", "model"], "is or holds the source model"),
    (["--out", "o", "--step", "0"], "--step 0.0: a fraction of the heads masked per level, in (0, 1)"),
    (["--out", "o", "--step", "1"], "--step 1.0: a fraction"),
])
def test_a_run_without_prune_refuses_bad_out_and_step_up_front(model, capsys, flags, words):
    assert main(["heads", "--model", "model", "--data", "missing.jsonl", "--task", "cls", *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and words in err and "Errno" not in err, err
    assert sorted(p.name for p in model.parent.iterdir()) == ["afile", "model"]  # nothing written
    assert (model.parent / "afile").read_text() == "x"
