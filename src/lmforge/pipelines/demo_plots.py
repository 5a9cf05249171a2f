"""The demo's figure: pretraining loss, cloze probes, and fine-tuning curves with and without pretraining."""
from __future__ import annotations

import json
from pathlib import Path

from lmforge.utils.atomic import atomic_savefig
from lmforge.utils.plots import series_style, whole_steps


def read_metrics(path) -> list:
    """The JSON lines of a run's metrics.jsonl."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _pretraining(ax, rows: list) -> None:
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], series_style(len(rows)), label="train",
            markersize=3)
    evals = [r for r in rows if "eval_loss" in r]
    ax.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="held out")
    ax.set(title="MLM pretraining", xlabel="step", ylabel="cross-entropy (nats)")
    whole_steps(ax)
    ax.legend()


def _probes(ax, probes: dict) -> None:
    # mean reciprocal rank: graded (unlike accuracy) and on the same 0-1 axis for every kind
    kinds = list(probes["trained"])
    x = range(len(kinds))
    for offset, (name, scores) in zip((-0.2, 0.2), probes.items()):
        ax.bar([i + offset for i in x], [scores[k]["mrr"] for k in kinds], width=0.4, label=name)
    ax.plot(list(x), [probes["trained"][k]["chance_mrr"] for k in kinds], "k_", markersize=18, label="chance")
    ax.set_xticks(list(x), kinds, rotation=35, ha="right")
    ax.set(title="Cloze probes", ylabel="mean reciprocal rank of the answer", ylim=(0, 1))
    ax.legend(fontsize=8)


def _task(ax, task: str, runs: dict) -> None:
    # a marker and dash of its own for each run: equal curves (common on a quick run) drew the second
    # exactly over the first, which vanished but for its legend entry
    styles = ({"marker": "o"}, {"marker": "s", "linestyle": "--", "markerfacecolor": "none", "markersize": 9})
    for (name, run), style in zip(runs.items(), styles):
        key = f"valid_{run['metric']}"
        rows = [r for r in read_metrics(run["metrics"]) if key in r]
        ax.plot([r["step"] for r in rows], [r[key] for r in rows], label=name, **style)
    ax.set(title=f"Fine-tuning: {task}", xlabel="step", ylabel=f"validation {run['metric']}")
    whole_steps(ax)
    ax.legend()


def plot_demo(report: dict, pretrain_metrics, path) -> Path:
    """Draw the four panels into one PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    _pretraining(axes[0, 0], read_metrics(pretrain_metrics))
    _probes(axes[0, 1], report["probes"])
    for ax, (task, runs) in zip(axes[1], report["tasks"].items()):
        _task(ax, task, runs)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return Path(path)
