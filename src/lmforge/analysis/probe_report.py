"""What a probing sweep (analysis/probing.py) reports: a summary, a table (rich) and a per-layer figure.

A report never runs a probe: it reads the sweep's results (plain JSON data).
"""
from __future__ import annotations

import math
from pathlib import Path

from lmforge.analysis.probing import LONG_RANGE
from lmforge.utils.atomic import atomic_savefig

STRUCTURAL_MAIN = {"distance": ("uuas", "dspr"), "depth": ("root_accuracy", "nspr")}


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def summary(results: dict) -> dict:
    """Per task its best layer (chosen on the development split), its test scores there, the expected
    layer and centre of gravity (label tasks), the baselines, and the field's orderings checked on these."""
    out, layers = {}, results["layers"]
    for task, r in results["tasks"].items():
        if task in STRUCTURAL_MAIN:
            main, second = STRUCTURAL_MAIN[task]
            at = layers.index(r["best_layer"])
            out[task] = {"best_layer": r["best_layer"], main: r[main][at], second: r[second][at]}
            continue
        head = "mlp" if "mlp" in r else "linear"
        at = layers.index(r[head]["best_layer"])
        c = r["cumulative"]
        out[task] = {"best_layer": r[head]["best_layer"], "accuracy": r[head]["accuracy"][at],
                     "selectivity": r[head].get("selectivity", [None] * len(layers))[at],  # no control
                     "expected_layer": c["expected_layer"], "center_of_gravity": c["center_of_gravity"]}
    out["checks"] = checks(out, results["baselines"])
    return out


def checks(per_task: dict, baselines: dict) -> dict:
    """The orderings the field reports (Tenney et al. 2019; Hewitt & Manning 2019) on this sweep."""
    found = {}
    long_range = [t for t in LONG_RANGE if t in per_task]
    if "pos" in per_task and long_range:
        pos = per_task["pos"]["expected_layer"]
        found["pos_expected_layer_below_long_range"] = all(
            _finite(pos) and _finite(per_task[t]["expected_layer"]) and pos < per_task[t]["expected_layer"]
            for t in long_range)
    if "distance" in per_task:
        found["uuas_points_above_right_branching"] = 100 * (per_task["distance"]["uuas"]
                                                            - baselines["right_branching_uuas"])
    return found


def _cell(x, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if _finite(x) else "-"


def table_rows(results: dict) -> list:
    """Rows of the table: [task, probe, score per layer..., best layer, selectivity, E[layer], CoG]."""
    rows, layers = [], results["layers"]
    for task, r in results["tasks"].items():
        if task in STRUCTURAL_MAIN:
            for key in STRUCTURAL_MAIN[task]:
                rows.append([task, key, *map(_cell, r[key]), str(r["best_layer"]), "-", "-", "-"])
            continue
        for head in ("linear", "mlp"):
            if head in r:
                h = r[head]
                at = layers.index(h["best_layer"])
                sel = h.get("selectivity", [math.nan] * len(layers))[at]
                rows.append([task, head, *map(_cell, h["accuracy"]), str(h["best_layer"]),
                             _cell(sel), "-", "-"])
        c = r["cumulative"]
        rows.append([task, "mix (cumul.)", *map(_cell, c["scores"]), "-", "-", _cell(c["expected_layer"], 2),
                     _cell(c["center_of_gravity"], 2)])
    return rows


def print_table(results: dict, console=None) -> None:
    """The per-layer table (and the baselines) printed with rich."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title="Probing: test score per layer (0 = embeddings)")
    for name in ["task", "probe", *map(str, results["layers"]), "best", "select.", "E[layer]", "CoG"]:
        table.add_column(name, justify="left" if name in ("task", "probe") else "right")
    for row in table_rows(results):
        table.add_row(*row)
    console.print(table)
    b = results["baselines"]
    console.print(f"right-branching UUAS {_cell(b['right_branching_uuas'])}"
                  + "".join(f"  layer-0 {k} {_cell(v)}" for k, v in b.get("layer0", {}).items()))


def _legend(ax) -> None:
    """The panel's legend beside it: inside, eight probes' entries covered the curves they name."""
    if ax.get_legend_handles_labels()[0]:  # a panel with nothing to show (no control task) has no legend
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _accuracy_panel(ax, results: dict) -> None:
    layers = results["layers"]
    for task, r in results["tasks"].items():
        if task in STRUCTURAL_MAIN:
            continue
        for head, style in (("mlp", "-o"), ("linear", "--s")):  # markers: one layer draws no line
            if head in r:
                ax.plot(layers, r[head]["accuracy"], style, label=f"{task} ({head})", markersize=4)
    ax.set(title="Label probes: test accuracy", xlabel="layer (0 = embeddings)", ylabel="accuracy")
    _legend(ax)


def _selectivity_panel(ax, results: dict) -> None:
    layers = results["layers"]
    for task, r in results["tasks"].items():
        for head, style in (("mlp", "-o"), ("linear", "--s")):
            if task not in STRUCTURAL_MAIN and "selectivity" in r.get(head, {}):
                ax.plot(layers, r[head]["selectivity"], style, label=f"{task} ({head})", markersize=4)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set(title="Selectivity: task - control accuracy (Hewitt & Liang 2019)", xlabel="layer",
           ylabel="selectivity")
    _legend(ax)


def _mix_panel(ax, results: dict) -> None:
    layers = results["layers"]
    tasks = [t for t, r in results["tasks"].items() if "cumulative" in r]
    width = 0.8 / max(len(tasks), 1)
    for i, task in enumerate(tasks):
        c = results["tasks"][task]["cumulative"]
        label = f"{task}: CoG {_cell(c['center_of_gravity'], 2)}, E[l] {_cell(c['expected_layer'], 2)}"
        ax.bar([x + (i - (len(tasks) - 1) / 2) * width for x in layers], c["mix_weights"], width, label=label)
    ax.set(title="Scalar-mix weights s_l (Tenney et al. 2019)", xlabel="layer", ylabel="weight")
    ax.set_xticks(layers)
    _legend(ax)


def _structural_panel(ax, results: dict) -> None:
    layers, low = results["layers"], 0.0
    for task, keys in STRUCTURAL_MAIN.items():
        for key, style in zip(keys, ("-o", "--s")):
            if task in results["tasks"]:
                ax.plot(layers, results["tasks"][task][key], style, label=key, markersize=4)
                low = min([low, *(v for v in results["tasks"][task][key] if v is not None and v == v)])
    rb = results["baselines"]["right_branching_uuas"]
    ax.axhline(rb, color="grey", linestyle=":", label=f"right-branching UUAS {rb:.2f}")
    # a Spearman correlation (dspr, nspr) may be below 0: a floor at 0 cut its points off the panel
    ax.set(title="Structural probes (Hewitt & Manning 2019)", xlabel="layer", ylabel="score",
           ylim=(max(-1.05, low - 0.05) if low < 0 else 0, 1))
    _legend(ax)


def plot_probes(results: dict, path, title: str = "") -> Path:
    """Draw accuracy, selectivity, scalar-mix weights and structural scores per layer into one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(16, 9))
    _accuracy_panel(axes[0, 0], results)
    _selectivity_panel(axes[0, 1], results)
    _mix_panel(axes[1, 0], results)
    _structural_panel(axes[1, 1], results)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.set_xticks(results["layers"])  # whole layers: a matplotlib default put ticks at layer 1.25
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return Path(path)
