"""The demo's figure: equal fine-tuning curves both stay visible; short runs get whole-step ticks."""
from __future__ import annotations

import json

from lmforge.pipelines import demo_plots


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_equal_runs_are_told_apart_and_steps_are_whole(tmp_path, monkeypatch):
    caught = []
    monkeypatch.setattr(demo_plots, "atomic_savefig", lambda fig, path, dpi=None: caught.append(fig))
    same = [{"step": s, "valid_accuracy": 0.4} for s in range(1, 5)]  # a quick run: both runs equal
    runs = {name: {"metric": "accuracy", "metrics": _write(tmp_path / f"{name}.jsonl", same)}
            for name in ("pretrained", "from scratch")}
    scores = {"fact": {"mrr": 0.2, "chance_mrr": 0.1}}
    pretrain = _write(tmp_path / "pretrain.jsonl", [{"step": s, "loss": 6.0 - s / 10} for s in range(1, 4)])
    demo_plots.plot_demo({"probes": {"untrained": scores, "trained": scores}, "tasks": {"sentiment": runs}},
                         pretrain, tmp_path / "demo.png")
    task = caught[0].axes[2]
    styles = {(line.get_marker(), line.get_linestyle()) for line in task.lines}
    assert len(styles) == 2  # the second run drawn exactly over the first would hide it
    assert all(float(t).is_integer() for ax in (caught[0].axes[0], task) for t in ax.get_xticks())
