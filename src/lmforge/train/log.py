"""Metrics as JSON lines, a progress bar with loss, throughput and ETA, and loss-curve plots."""
from __future__ import annotations

import json
import math
from pathlib import Path

from lmforge.utils.atomic import append_text, atomic_savefig, atomic_write_text, refuse_link
from lmforge.utils.plots import series_style, whole_steps
from lmforge.utils.progress import Bar


class MetricsLog:
    """Appends one JSON object per logged step to DIR/metrics.jsonl (a resumed run continues it); a
    symbolic link there is refused (UnsafePath), never written through."""

    def __init__(self, path: Path, resume_step: int = 0) -> None:
        self.path = refuse_link(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():  # drop lines past the checkpoint we resume from: they will be redone
            kept = [r for r in read_metrics(path) if r.get("step", 0) <= resume_step]
            atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record: dict) -> None:
        """Append one record (floats rounded to 6 significant digits)."""
        clean = {k: (float(f"{v:.6g}") if isinstance(v, float) and math.isfinite(v) else v)
                 for k, v in record.items()}
        append_text(self.path, json.dumps(clean) + "\n")


def read_metrics(path: Path) -> list:
    """Every record of a metrics.jsonl file (a torn last line, from a killed run, is skipped)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _plot_series(ax, records: list) -> list:
    """Draw loss and eval_loss on `ax`; what the plot cannot show, in words (non-finite values, none)."""
    notes = []
    for key, style in (("loss", None), ("eval_loss", "o-")):  # evaluations: a marker at each
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        bad = [step for step, value in points if not math.isfinite(value)]
        points = [(step, value) for step, value in points if math.isfinite(value)]
        if points:
            ax.plot(*zip(*points), style or series_style(len(points)), label=key.replace("_", " "),
                    markersize=3)
        if bad:  # skipped (non-finite) steps would otherwise vanish from the plot unremarked
            notes.append(f"{key.replace('_', ' ')} not finite at {len(bad)} step(s), first {bad[0]}")
    return notes if ax.lines else [*notes, "no losses logged"]


def plot_losses(metrics: Path, png: Path, title: str = "training") -> Path:
    """Training (and evaluation) loss against step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    notes = _plot_series(ax, read_metrics(metrics))
    ax.set(xlabel="step", ylabel="loss", title=f"{title} loss" if title else "loss")
    whole_steps(ax)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    if notes:
        ax.text(0.5, 0.5 if not ax.lines else 0.02, "; ".join(notes), transform=ax.transAxes,
                ha="center", va="center" if not ax.lines else "bottom", color="firebrick", fontsize=9)
    fig.tight_layout()
    atomic_savefig(fig, png, dpi=120)
    plt.close(fig)
    return png


class Progress(Bar):
    """A training run's bar: step, loss, tokens/s and ETA (silent when disabled)."""

    def __init__(self, total: int, start: int, enabled: bool, label: str = "train") -> None:
        super().__init__(total, label, enabled, start, fields={"loss": "loss {}", "speed": "{} tok/s"})

    def update(self, step: int, loss: float | None = None, tokens_per_s: float | None = None) -> None:
        """Move to `step`, showing the latest loss and throughput."""
        fields = {}
        if loss is not None:
            fields["loss"] = f"{loss:.4f}"
        if tokens_per_s is not None:
            fields["speed"] = f"{tokens_per_s:,.0f}"
        super().update(step, **fields)
