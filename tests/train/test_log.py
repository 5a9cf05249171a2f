"""The loss plot: what it draws for a normal run, one logged step, non-finite losses and no losses."""
from __future__ import annotations

import json
import math

import pytest

from lmforge.train import log


@pytest.fixture
def drawn(tmp_path, monkeypatch):
    """plot_losses over the given records; the figure's axes (caught before it is saved and closed)."""
    caught = []
    monkeypatch.setattr(log, "atomic_savefig", lambda fig, path, dpi=None: caught.append(fig.axes[0]))

    def draw(records):
        metrics = tmp_path / "metrics.jsonl"
        metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
        log.plot_losses(metrics, tmp_path / "loss.png", "mlm")
        return caught[-1]
    return draw


def _texts(ax) -> str:
    return " ".join(t.get_text() for t in ax.texts)


def test_a_run_is_drawn_with_labelled_axes_a_title_and_a_legend(drawn):
    ax = drawn([{"step": s, "loss": 9 - s / 50} for s in range(1, 101)] + [{"step": 50, "eval_loss": 8.5}])
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("step", "loss", "mlm loss")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["loss", "eval loss"]
    assert not ax.texts


def test_one_logged_step_is_a_visible_marker_on_whole_steps(drawn):
    ax = drawn([{"step": 1, "loss": 9.1}])
    assert ax.lines[0].get_marker() == "o"
    assert all(float(t).is_integer() for t in ax.get_xticks())


def test_non_finite_losses_are_said_in_words_not_silently_dropped(drawn):
    ax = drawn([{"step": s, "loss": math.nan if s > 5 else 5.0 - s / 10} for s in range(1, 11)])
    assert all(math.isfinite(y) for y in ax.lines[0].get_ydata())
    assert "loss not finite at 5 step(s), first 6" in _texts(ax)


def test_no_losses_says_so_and_draws_no_empty_legend(drawn):
    ax = drawn([])
    assert "no losses logged" in _texts(ax) and ax.get_legend() is None
