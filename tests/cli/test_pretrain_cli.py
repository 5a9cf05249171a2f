"""`lmforge pretrain`: what each source of an option gives, and which wins."""
import pytest

from lmforge.cli import main


class Captured(Exception):
    """Raised by a stand-in for the training run, carrying its options."""


def test_a_flag_wins_over_key_value_which_wins_over_the_config_file(tmp_path, monkeypatch):
    import lmforge.train.pretrain as pretrain

    def run(objective, out, train, recipe, inputs):
        raise Captured(train, recipe)

    monkeypatch.setattr(pretrain, "pretrain", run)
    (tmp_path / "c.yaml").write_text("steps: 2\nseed: 7\nlr: 1e-3\nwarmup: 5\nmax_len: 16\n")
    base = ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(tmp_path / "o"),
            "--config", str(tmp_path / "c.yaml")]
    with pytest.raises(Captured) as got:
        main([*base, "--steps", "1", "--seed", "3", "--max-len", "8", "lr=2e-3"])
    train, recipe = got.value.args
    assert (train.steps, train.seed, recipe.max_len, train.lr, train.warmup) == (1, 3, 8, 2e-3, 5)
    with pytest.raises(Captured) as got:  # no flag: the file's, not the flag's default (seed 0)
        main(base)
    assert (got.value.args[0].steps, got.value.args[0].seed) == (2, 7)


@pytest.mark.usefixtures("few_probes")  # tests/conftest.py
def test_a_resume_from_a_damaged_or_non_object_trainer_json_is_refused_in_one_line(tmp_path, capsys):
    """A cut trainer.json, one holding a list or JSON nested too deeply (a RecursionError traceback): a
    resume exits 2 with one error line naming the file, never starting over on top of the run."""
    out = tmp_path / "run"
    args = ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(out), "--steps", "1",
            "batch_size=2", "save_every=1", "progress=false", "n_docs=50", "n_layers=1", "d_model=32",
            "n_heads=2", "d_ff=64", "max_seq_len=64"]
    assert main(args) == 0
    file = out / "checkpoints" / "step-0000001" / "trainer.json"
    text = file.read_text()
    args[8] = "2"
    for damaged in (text[: len(text) // 2], "[1, 2]", "[" * 100_000 + "]" * 100_000):
        file.write_text(damaged)
        capsys.readouterr()
        assert main([*args, "--resume"]) == 2
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("lmforge pretrain: error:")]
        assert len(errors) == 1 and "Traceback" not in err, err
        assert f"{file.parent}: trainer.json " in errors[0] and "refusing to start over" in errors[0]
    assert not (out / "checkpoints" / "step-0000002").exists()
