"""The bake-off's report: a table per plan, learning curves against FLOPs, and the claims judged.

For each arm and task: mean +- sample standard deviation (n - 1) over seeds of the test-set primary
metric; the page and report.json also say the budget, seeds, each arm's steps and counted FLOPs, how
they are counted, and the hardware the result rows record. For each claim "arm A > arm B on task T",
with delta = mean(A) - mean(B) and sd the standard deviation of that difference (sqrt(sd_A^2 / n_A +
sd_B^2 / n_B), the standard error of a difference of two means): "reproduced" when delta > 0 and |delta|
> t sd, "reversed" when delta < 0 and |delta| > t sd, else "not resolved at this scale" (one seed, or
|delta| within t sd: no verdict the data cannot carry). t is Welch's two-sided 5 % critical value at the
Welch-Satterthwaite degrees of freedom (4.30 for 2 seeds an arm of equal spread, 2.78 for 3, near 2 only
past ~60 seeds): a fixed 2 sd would call about one tie in five a win or a loss at 2 seeds. Two arms with
no spread over seeds (every seed the same number) are told apart by the sign of delta alone.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from lmforge.bakeoff.fingerprint import current, pretrain_key, schedule_key
from lmforge.bakeoff.layout import CURVES, REPORT, SCHEDULE, SUMMARY
from lmforge.bakeoff.plan import Plan
from lmforge.bakeoff.results import read_results
from lmforge.config import atomic_write_text
from lmforge.train.log import read_metrics
from lmforge.utils.atomic import atomic_savefig
from lmforge.utils.plots import series_style

REPRODUCED, REVERSED, UNRESOLVED = "reproduced", "reversed", "not resolved at this scale"
ALPHA = 0.05  # a verdict's two-sided significance level (Welch's t-test)
SD = "sample standard deviation over seeds (n - 1 in the denominator; none for one seed)"
COUNTED = ("training FLOPs = 3 x the forward pass's matmul FLOPs (bakeoff/flops.py), each part on the "
           "positions it runs on: an encoder on the real tokens of a micro-batch (the trainer unpads; "
           "attention re-padded where the CPU runs it so), a decoder on the padded length, a masked LM's "
           "vocabulary projection on rate x the maskable tokens (not special tokens, not padding), both "
           "measured on a fixed sample of the arm's own examples (bakeoff/sample.py; an arm with a "
           "checkpoint's tokenizer: every position, an upper bound), a prefix LM's on the continuation; "
           "ELECTRA's generator and discriminator both; activation recomputation not counted")


def _measured(s: dict) -> str:
    """What an arm's schedule was counted with: the shares of max_len its examples hold ('': none)."""
    shares = s.get("shares")
    if not isinstance(shares, dict) or not shares:
        return ""
    return (f"; examples padded to {shares.get('padded', 1):.2f}, maskable tokens "
            f"{shares.get('maskable', 1):.2f} of max_len")


def hardware_of(rows: list) -> list:
    """The distinct devices the rows' pretraining and fine-tuning ran on (runner.hardware_of), sorted."""
    found = set()
    for row in rows:
        record = row.get("hardware")
        if isinstance(record, dict):
            found.update(v for v in record.values() if isinstance(v, str))
    return sorted(found)


def summarise(rows: list) -> dict:
    """(arm, task) -> {"metric", "mean", "sd", "n", "values"} over the seeds' rows."""
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["arm"], row["task"]), []).append(row)
    out = {}
    for key, group in groups.items():
        values = [r["value"] for r in sorted(group, key=lambda r: r["seed"])]
        # statistics.stdev raises on a NaN (AttributeError deep inside): a NaN result spreads as NaN
        finite = all(map(math.isfinite, values))
        sd = math.nan if not finite else statistics.stdev(values) if len(values) > 1 else 0.0
        out[key] = {"metric": group[0]["metric"], "mean": statistics.fmean(values), "sd": sd,
                    "n": len(values), "values": values}
    return out


def critical_t(better: dict, worse: dict) -> float:
    """Welch's two-sided 5 % critical value of t for two summaries (n >= 2 each; 0 with no spread)."""
    from scipy.stats import t

    a, b = better["sd"] ** 2 / better["n"], worse["sd"] ** 2 / worse["n"]
    if a + b == 0:
        return 0.0
    df = (a + b) ** 2 / (a ** 2 / (better["n"] - 1) + b ** 2 / (worse["n"] - 1))
    return float(t.ppf(1 - ALPHA / 2, df))


def verdict(better: dict, worse: dict) -> tuple:
    """(verdict, delta, sd of delta) of the claim better > worse from two summaries."""
    delta = better["mean"] - worse["mean"]
    if better["n"] < 2 or worse["n"] < 2:
        return UNRESOLVED, delta, math.nan
    sd = math.sqrt(better["sd"] ** 2 / better["n"] + worse["sd"] ** 2 / worse["n"])
    if delta != 0 and abs(delta) > critical_t(better, worse) * sd:
        return (REPRODUCED if delta > 0 else REVERSED), delta, sd
    return UNRESOLVED, delta, sd


def table(plan: Plan, summary: dict) -> list:
    """Markdown lines: one row per arm, one column per task headed by its metric (mean +- sd, n seeds),
    the highest mean of each task in bold."""
    tasks = [t["name"] for t in plan.tasks]
    metric = {task: next((s["metric"] for (_, t), s in summary.items() if t == task), "") for task in tasks}
    # a NaN mean is no one's best: max() over it answered by the arms' order (nan first: no bold at all)
    best = {task: max((s["mean"] for (_, t), s in summary.items() if t == task and math.isfinite(s["mean"])),
                      default=None) for task in tasks}
    head = [f"{task} ({metric[task]})" if metric[task] else task for task in tasks]
    lines = ["| arm | " + " | ".join(head) + " |", "|---|" + "---|" * len(tasks)]
    for arm in plan.arms:
        cells = []
        for task in tasks:
            s = summary.get((arm.name, task))
            if s is None:
                cells.append("not run")
                continue
            mean = f"**{s['mean']:.4f}**" if s["mean"] == best[task] else f"{s['mean']:.4f}"
            spread = f" ± {s['sd']:.4f}" if s["n"] > 1 else ""  # one seed has no spread (not 0)
            cells.append(f"{mean}{spread} (n={s['n']})")
        lines.append(f"| {arm.name} | " + " | ".join(cells) + " |")
    return lines


def claim_lines(plan: Plan, summary: dict) -> list:
    """One line per claim: the claim, delta +- sd and the verdict (or what is missing)."""
    lines = []
    for claim in plan.claims:
        a, b = summary.get((claim.better, claim.task)), summary.get((claim.worse, claim.task))
        text = (f"{claim.better} > {claim.worse} on {claim.task}"
                + (f" ({claim.source})" if claim.source else ""))
        if a is None or b is None:
            lines.append(f"- {text}: not run yet")
            continue
        found, delta, sd = verdict(a, b)
        # a seed's metric NaN (a constant prediction's correlation): no Δ at all
        if not math.isfinite(delta):
            lines.append(f"- {text}: a result is not a number (NaN), no Δ → **{found}**")
            continue
        spread = (f"± {sd:.4f} (sd of Δ)" if math.isfinite(sd)
                  else "(a single seed: no spread to judge it by)")
        lines.append(f"- {text}: Δ = {delta:+.4f} {spread} → **{found}**")
    return lines


def _spent_before(plan: Plan, arm, schedules: dict) -> float:
    """FLOPs a continued arm's model had had before its own run (the arms it continues)."""
    spent = 0.0
    while arm.continue_from is not None:
        arm = plan.arm(arm.continue_from)
        spent += schedules.get(arm.name, {}).get("flops", 0.0)
    return spent


def _stamp(run: Path) -> str | None:
    """The fingerprint a pretraining run directory was started for (runner.STAMP; None: none, unreadable)."""
    try:
        return json.loads((run / "plan.json").read_text(encoding="utf-8")).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def plan_schedules(plan: Plan, out: Path) -> dict:
    """arm name -> its entry of OUT/schedule.json, for the arms whose entry was counted for the plan as it
    is (its fingerprint): a run of a changed plan (budget, batch size, arm) counted other steps."""
    try:
        found = json.loads((out / SCHEDULE).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or damaged: every run (and --dry-run) writes it again
        return {}
    found = found if isinstance(found, dict) else {}
    return {arm.name: found[arm.name] for arm in plan.arms if isinstance(found.get(arm.name), dict)
            and found[arm.name].get("fingerprint") == schedule_key(plan, arm)}


def _arm_curves(ax, plan: Plan, out: Path, schedules: dict) -> int:
    """Draw each arm's seeds' loss against FLOPs on `ax`; how many non-finite losses were left out."""
    bad = 0
    for i, arm in enumerate(plan.arms):
        per_step = schedules.get(arm.name, {}).get("flops_per_step")
        offset = _spent_before(plan, arm, schedules)
        for j, seed in enumerate(plan.seeds):
            run = out / arm.name / f"seed-{seed}" / "pretrain"
            # a run begun for another version of the plan (its budget, recipe) is not this plan's curve
            ours = per_step and _stamp(run) == pretrain_key(plan, arm, seed)
            path = run / "metrics.jsonl"
            records = [r for r in read_metrics(path) if "loss" in r] if ours and path.is_file() else []
            finite = [r for r in records if math.isfinite(r["loss"])]
            bad += len(records) - len(finite)
            if finite:
                ax.plot([offset + r["step"] * per_step for r in finite], [r["loss"] for r in finite],
                        series_style(len(finite)), markersize=3, color=f"C{i % 10}", alpha=0.8,
                        label=arm.name if j == 0 else None)
    return bad


def curves(plan: Plan, out: Path, schedules: dict) -> Path | None:
    """learning_curves.png: each arm's pretraining loss against training FLOPs (every seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, ax = plt.subplots(figsize=(7, 4.5))
    bad = _arm_curves(ax, plan, out, schedules)
    if not ax.lines:
        plt.close(fig)
        return None
    seeds = f"{len(plan.seeds)} seed{'s' if len(plan.seeds) > 1 else ''} an arm, one line each"
    ax.set(xlabel="training FLOPs", ylabel="pretraining loss (each objective's own)",
           title=f"bake-off {plan.name}: pretraining loss by compute ({seeds})")
    low, high = ax.dataLim.intervalx
    if high >= 10 * low:  # log only where FLOPs span a decade or more: inside one, no tick had a label
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels on a short log range overlap
    if bad:  # a skipped step's loss is not drawn: say so rather than cut the curve short unremarked
        ax.text(0.5, 0.02, f"{bad} non-finite loss value(s) not drawn", transform=ax.transAxes,
                ha="center", va="bottom", color="firebrick", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_savefig(fig, out / CURVES, dpi=110)
    plt.close(fig)
    return out / CURVES


def report_data(plan: Plan, summary: dict, schedules: dict, hardware: list) -> dict:
    """report.json's content: budget, seeds, schedules (steps, FLOPs), how FLOPs are counted, hardware,
    the summary (a single seed's sd null) and the claims' verdicts."""
    return {"plan": plan.name, "budget": plan.budget, "seeds": list(plan.seeds), "schedules": schedules,
            "flops": COUNTED, "hardware": hardware, "sd": SD,
            "summary": [{"arm": a, "task": t, **s, "sd": s["sd"] if s["n"] > 1 else None}  # one seed: no sd
                        for (a, t), s in summary.items()],
            "claims": [{"better": c.better, "worse": c.worse, "task": c.task,
                        "verdict": verdict(summary[(c.better, c.task)], summary[(c.worse, c.task)])[0]}
                       for c in plan.claims
                       if (c.better, c.task) in summary and (c.worse, c.task) in summary]}


def write_report(plan: Plan, out) -> Path:
    """OUT/report.md (table, claims, curves) and OUT/report.json; returns the markdown's path."""
    out = Path(out)
    rows, stale = current(plan, read_results(out))  # results of an earlier version of the plan: left out
    # the seeds the header names, as the curves read them: --seeds 0 after a 3-seed run reports seed 0 alone
    other = [r for r in rows if r["seed"] not in plan.seeds]
    summary = summarise([r for r in rows if r["seed"] in plan.seeds])
    hardware = hardware_of([r for r in rows if r["seed"] in plan.seeds])
    schedules = plan_schedules(plan, out)
    png = curves(plan, out, schedules)
    lines = [f"# Bake-off: {plan.name}", "",
             f"Budget {plan.budget:.3g} training FLOPs per arm; seeds {list(plan.seeds)}; test-set primary "
             f"metric (column heads name it), mean ± sd over seeds (sd: the {SD}), the best mean of each "
             "task in bold.", "", f"Hardware: {'; '.join(hardware) or 'not recorded'}.", "",
             *table(plan, summary), "", f"Steps and counted FLOPs per arm ({COUNTED}):", ""]
    for arm in plan.arms:
        s = schedules.get(arm.name)
        lines.append(f"- {arm.name}: not counted for this version of the plan (a run or --dry-run counts it)"
                     if s is None else
                     f"- {arm.name}: {s['steps']} steps x {s['flops_per_step']:.3g} = {s['flops']:.4g} FLOPs "
                     f"({100 * (s['flops'] / plan.budget - 1):+.2f} % of the budget{_measured(s)})"
                     if s["steps"]
                     else f"- {arm.name}: no pretraining of its own (a baseline)")
    lines += ["", "Claims (reproduced: the sign matches and Welch's t-test rejects a tie at 5 %, two-sided):",
              "", *claim_lines(plan, summary)]
    if stale:
        lines += ["", f"{len(stale)} result(s) of an earlier version of the plan left out (a rerun "
                      "replaces them)."]
    if other:
        seeds = sorted({r["seed"] for r in other})
        lines += ["", f"{len(other)} result(s) of seeds {seeds} left out (not among this report's seeds)."]
    if png is not None:
        lines += ["", f"![learning curves]({png.name})"]
    report = out / REPORT
    atomic_write_text(report, "\n".join(lines) + "\n")
    data = report_data(plan, summary, schedules, hardware)
    atomic_write_text(out / SUMMARY, json.dumps(data, indent=1) + "\n")
    return report
