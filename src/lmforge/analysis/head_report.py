"""`lmforge heads`: importance table, pruning curves (by importance and at random), physical pruning.

Writes heads.json (importance per attention, layer and head; the importance curve and the random
orders' curve, mean and sd per level; the pruned model's sizes and speed), heads.png (metric
against the share of heads pruned: importance, the random mean with a +-1 sd band) and, when
asked to prune, the pruned model as a loadable directory with its tokenizer and task.json.
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass

import torch

from lmforge.compress.head_importance import (MAX_BATCH, CurveOptions, against_band, curve_band, full_gates,
                                              gates_at, head_importance, masked_heads, metric, pruning_curve,
                                              random_curves, total_heads)
from lmforge.compress.head_pruning import head_counts, prune_heads
from lmforge.compress.measure import given_data
from lmforge.compress.model_files import output_folder
from lmforge.config import atomic_write_text
from lmforge.config.options import MAX_SEED, OptionsError, check_options, option
from lmforge.fast.optimize import optimize
from lmforge.io import model_dir as resolve_dir
from lmforge.tasks.fields import given_records
from lmforge.tasks.finetune import encode_split, fine_tuned_task, keep_model
from lmforge.tasks.reference import saved_kind
from lmforge.utils.atomic import atomic_savefig, remove_path
from lmforge.utils.timing import alternating

MAX_ORDERS = 1000  # random orders a report averages


@dataclass
class HeadsOptions:
    """Options of `lmforge heads`: the curves' step and seeds, and how far to prune physically."""

    prune: float | None = option(None, "remove this share of the heads by importance, physically", low=0,
                                 high=1, open_low=True, open_high=True)
    until: float | None = option(None, "remove heads while the metric stays >= this x the unpruned one",
                                 low=0, high=1, open_low=True)
    step: float = option(0.1, "share of all heads masked per level", low=0, high=1, open_low=True,
                         open_high=True)
    seed: int = option(0, "the first random order's seed (the others: seed + 1, ...)", low=0, high=MAX_SEED)
    batch_size: int = option(32, "examples per batch of the importance estimate", low=1, high=MAX_BATCH)
    random_orders: int = option(5, "random pruning orders averaged as the control (mean +- sd per level)",
                                low=1, high=MAX_ORDERS)

    def __post_init__(self) -> None:
        check_options(self)
        if self.prune is not None and self.until is not None:
            raise OptionsError("give prune or until, not both", "until")

    def curve(self) -> CurveOptions:
        """The importance curve's options (until stops it early)."""
        return CurveOptions(step=self.step, until=self.until, seed=self.seed, batch_size=self.batch_size)


def forward_seconds(model, examples: list, task, batch_size: int = 16, repeats: int = 5) -> float:
    """Median seconds of one inference forward over the first `batch_size` examples."""
    batch = {k: v.to(task.device) for k, v in task.collate(examples[:batch_size]).items()}
    times = []
    with torch.no_grad():
        task.eval()
        task.predict(batch)  # warm-up: first-call allocations
        for _ in range(repeats):
            start = time.perf_counter()
            task.predict(batch)
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _prune_level(levels: list, prune: float | None, until: float | None) -> int:
    """Index of the level to prune physically: the last within `prune`, or the last scoring at
    least until x the unpruned metric."""
    if prune is not None:
        return max(i for i, lv in enumerate(levels) if lv["fraction"] <= prune + 1e-9)
    base = levels[0]["metric"]
    return max(i for i, lv in enumerate(levels) if lv["metric"] >= until * base)


HEADS_WRITES = ("heads.json", "heads.png", "pruned")  # what a run writes into out


def run_heads(model_dir, records: list, out, kind: str | None = None, importance_records: list | None = None,
              options: HeadsOptions | None = None, *, progress=None) -> dict:
    """Importance, the importance curve, `random_orders` random-order curves (seeds seed, seed + 1,
    ...; their mean and sd per level) and (with prune or until) the physically pruned model."""
    # out apart from the model read, as --out is: OUT/pruned would replace a model folder of that name
    o, out = options or HeadsOptions(), output_folder(out, resolve_dir(model_dir), HEADS_WRITES, "model_dir")
    # the records checked before the model is loaded (as prune's), by the kind its folder's task.json says
    records, imp = _given(model_dir, kind, records, importance_records)
    out.mkdir(parents=True, exist_ok=True)
    task = fine_tuned_task(model_dir, records, kind)
    # Python's records read as a file's, as evaluate reads them: an error names data or importance data
    records = given_records(records, task.kind, "data")
    imp = imp and given_records(imp, task.kind, "importance data")
    examples = encode_split(task, records, "data")
    imp_examples = encode_split(task, imp, "importance data") if imp else examples
    say = (lambda order: (lambda lv: progress(order, lv))) if progress else (lambda order: None)
    curves = {"importance": pruning_curve(task, (records, examples), imp_examples, o.curve(),
                                          progress=say("importance"))[0]}
    randoms = random_curves(task, (records, examples), o.random_orders,
                            CurveOptions(step=o.step, seed=o.seed), progress=say("random"))
    curves["random"], band = randoms[0], curve_band(randoms)
    report = {"heads": total_heads(full_gates(task.model.config)),
              "metric_name": curves["importance"][0]["name"],
              "importance": _table(head_importance(task, imp_examples, batch_size=o.batch_size)),
              "curves": curves,
              "random": {"orders": o.random_orders, "seeds": [o.seed + i for i in range(o.random_orders)],
                         "band": band, "importance_vs_mean": against_band(curves["importance"], band)}}
    if o.prune is not None or o.until is not None:
        report["pruned"] = _prune_and_save(task, records, examples, curves["importance"], o.prune, o.until,
                                           out / "pruned")
    atomic_write_text(out / "heads.json", json.dumps(report, indent=2) + "\n")
    plot_curves(curves, report["metric_name"], out / "heads.png", band)
    return report


def _given(model_dir, kind, records, importance_records) -> tuple:
    """(records, importance records) checked as prune's are before any work (compress.measure.given_data):
    no list of records, an empty one or a record not a dict is an OptionsError naming its argument; each
    record's fields too where the model folder's task.json (or `kind`) says the task. [] of importance
    records is refused (it would rank on `records`, unsaid); None ranks on `records`."""
    kind = saved_kind(model_dir, kind)
    imp = importance_records
    if imp is not None:
        imp = given_data(imp, kind, "importance_records")
    return given_data(records, kind), imp


def _table(importance: dict) -> dict:
    return {a: [[round(float(x), 6) for x in layer] for layer in layers] for a, layers in importance.items()}


def _prune_and_save(task, records, examples, curve: list, prune, until, path) -> dict:
    """Remove the heads the importance curve masked up to the chosen level, save the smaller model,
    and measure parameters, metric and forward time (side by side with a copy of the model as it
    was) before and after; where no level of the curve removes a head, say so and save nothing (an
    earlier run's model at `path` is removed: it would pass for this run's). The model replaces
    `path` whole (lmforge/atomic.replace_dir): no file of an earlier model is left mixed in."""
    level = _prune_level(curve, prune, until)
    asked = {"prune": prune} if prune is not None else {"until": until}
    if level == 0:
        first = next((lv["fraction"] for lv in curve[1:]), None)
        why = (f"the curve's first level removes {first:.4f} of the heads" if first is not None
               else "the curve has no level that removes heads")
        option = f"--prune {prune}" if prune is not None else f"--until {until}"
        note = f"no heads removed at {option}: {why}"
        if path.exists() or path.is_symlink():
            remove_path(path)
            note += f"; {path} from an earlier run removed"
        return {"asked": asked, "level": curve[0], "note": note}
    gates = gates_at(task.model.config, curve[:level + 1])
    unpruned = copy.deepcopy(task.model).eval()
    prune_heads(task.model, masked_heads(gates, task.model.config))
    optimize(task.model)  # the new, smaller projections too: timed as the unpruned copy is
    batch = {k: v.to(task.device) for k, v in task.collate(examples[:16]).items()}
    task.eval()
    with torch.no_grad():  # alternating rounds: load from elsewhere hits both alike
        seconds = alternating({"before": lambda: _predict_with(task, unpruned, batch),
                               "after": lambda: task.predict(batch)}, rounds=9)
    before = {"parameters": unpruned.num_parameters(), "seconds": seconds["before"],
              "metric": curve[0]["metric"]}
    after = {"parameters": task.model.num_parameters(), "seconds": seconds["after"],
             "metric": metric(task, records, examples, None)[1]}
    keep_model(task, path)  # whole, never mixed with an older one
    removed = [head for lv in curve[1:level + 1] for head in lv["masked"]]  # a level lists its new ones
    return {"asked": asked, "level": curve[level], "removed": removed, "before": before, "after": after,
            "heads": head_counts(task.model.config), "speedup": before["seconds"] / after["seconds"],
            "dir": str(path)}


def _predict_with(task, model, batch: dict) -> list:
    """task.predict(batch) with `model` as its backbone for the call (the task head is shared)."""
    own = task.model
    task.model = model
    try:
        return task.predict(batch)
    finally:
        task.model = own


def plot_curves(curves: dict, metric_name: str, path, band: list | None = None) -> None:
    """The metric against the share of heads pruned, by importance and at random (Michel et al. fig. 3);
    with `band` (curve_band of several random orders) the random orders' mean and a +-1 sd band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    levels = curves.get("importance") or []
    # drawn over the random curve: both start at the unpruned model's score, where its point was hidden
    ax.plot([100 * lv["fraction"] for lv in levels], [lv["metric"] for lv in levels], "o-",
            label="importance", zorder=3)
    if band:
        x = [100 * b["fraction"] for b in band]
        mean, sd = [b["mean"] for b in band], [b["sd"] for b in band]
        n = band[0]["n"]
        ax.plot(x, mean, "s--", color="tab:orange",
                label=f"random (mean of {n} orders)" if n > 1 else "random")
        if n > 1:  # one order has no spread: its "± 1 sd" entry named a band that is not there
            ax.fill_between(x, [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)],
                            color="tab:orange", alpha=0.25, label="random ± 1 sd")
    else:
        levels = curves.get("random") or []
        ax.plot([100 * lv["fraction"] for lv in levels], [lv["metric"] for lv in levels], "s--",
                label="random")
    if len({x for line in ax.lines for x in line.get_xdata()}) < 2:  # one level: not a +-0.04 % axis
        ax.set_xlim(-5, 105)
    ax.set_xlabel("heads pruned (%)")
    ax.set_ylabel(metric_name)
    ax.set_title("Pruning heads by importance vs at random")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_savefig(fig, path)
    plt.close(fig)
