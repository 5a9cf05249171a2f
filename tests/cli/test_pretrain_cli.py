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
