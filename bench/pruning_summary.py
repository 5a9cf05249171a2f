"""One picture and one table of every field-task pruning run in bench/results/ (written by
bench/movement_vs_magnitude.py --task field): test accuracy by method, share kept and seed, and
where soft movement put the weights it kept; soft movement's runs at other lambdas
(soft_movement_lambda*.json) are listed apart.

    python -m bench.pruning_summary
    # -> bench/results/pruning_field_summary.json, bench/plots/pruning_field_summary.png

Only runs with the same budget as the first are gathered (steps, lr, schedule): a run of another
budget is named and left out, not averaged in.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean

from lmforge.compress.sparsity import FLOOR

HERE = Path(__file__).resolve().parent
RESULT, PLOT = HERE / "results" / "pruning_field_summary.json", HERE / "plots" / "pruning_field_summary.png"
METHODS = ("magnitude", "movement", "soft-movement")
DEFAULT_LAMBDA = 400.0  # the table's soft movement; other lambdas are the sweep's
KINDS = ("attn.qkv", "attn.out", "ffn.up", "ffn.down")  # MiniLM's block Linears (q, k, v fused)


def gather(results: Path = HERE / "results") -> tuple:
    """Runs of the field task at the first file's budget ({method, kept, seed, test, valid, file,
    by}), the files of another budget or superseded, and the budget."""
    runs, skipped, budget = [], [], None
    for path in sorted(results.glob("movement_pruning_field*.json")):
        data = json.loads(path.read_text())
        key = {k: data["budget"][k] for k in ("steps", "lr", "schedule")}
        budget = budget or key
        lam = data["budget"].get("soft_lambda", DEFAULT_LAMBDA)
        if key != budget or lam != DEFAULT_LAMBDA or "superseded" in data:
            skipped.append(path.name)
            continue
        runs += [{"method": r["method"], "kept": r["kept"], "seed": data.get("seed", 0),
                  "test": r["test_accuracy"], "valid": r["valid_accuracy"], "file": path.name,
                  "by": r.get("kept_by_matrix")}
                 for r in data["runs"]]
    return runs, skipped, budget


def sweep(results: Path = HERE / "results") -> list:
    """Soft movement runs at other lambdas (soft_movement_lambda*_field*.json; the default 400
    runs are the table's): [{soft_lambda, seed, kept, test, valid}], by lambda."""
    rows = []
    for path in sorted(results.glob("soft_movement_lambda*_field*.json")):
        data = json.loads(path.read_text())
        if "superseded" in data:  # a run of code since mended: its note says what
            continue
        rows += [{"soft_lambda": data["budget"]["soft_lambda"], "seed": data["seed"], "kept": r["kept"],
                  "test": round(r["test_accuracy"], 4), "valid": round(r["valid_accuracy"], 4),
                  "file": path.name}
                 for r in data["runs"]]
    return sorted(rows, key=lambda r: (r["kept"], r["soft_lambda"], r["seed"]))


def table(runs: list) -> list:
    """Mean test / validation accuracy per (kept, method), with the seeds behind each."""
    rows = []
    for kept in sorted({r["kept"] for r in runs}, reverse=True):
        for method in METHODS:
            these = [r for r in runs if r["kept"] == kept and r["method"] == method]
            if these:
                rows.append({"kept": kept, "method": method, "seeds": sorted(r["seed"] for r in these),
                             "test": round(mean(r["test"] for r in these), 4),
                             "valid": round(mean(r["valid"] for r in these), 4),
                             "test_by_seed": {r["seed"]: round(r["test"], 4) for r in these}})
    return rows


def plot(runs: list, path: Path, lambdas: list) -> None:
    """Left: test accuracy per method at each share kept (a dot per seed, a bar for the mean),
    with soft movement at another lambda where two seeds ran it; right: soft movement's share kept
    per layer and matrix kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120,
                                      gridspec_kw={"width_ratios": [1, 1.3]})
    shares = sorted({r["kept"] for r in runs}, reverse=True)
    names = {"soft-movement": f"soft-movement, lambda {DEFAULT_LAMBDA:g}"}
    series = [(names.get(m, m), c, [r for r in runs if r["method"] == m])
              for m, c in zip(METHODS, ("tab:gray", "tab:blue", "tab:orange"))]
    for lam in sorted({r["soft_lambda"] for r in lambdas}):
        these = [r for r in lambdas if r["soft_lambda"] == lam]
        if any(sum(r["kept"] == k for r in these) >= 2 for k in shares):
            series.append((f"soft-movement, lambda {lam:g}", "tab:red", these))
    width, labelled = 0.8 / len(series), set()
    for i, kept in enumerate(shares):
        for j, (label, color, these) in enumerate(series):
            tests = [r["test"] for r in these if r["kept"] == kept]
            if tests:
                x = i + (j - (len(series) - 1) / 2) * width
                left.bar(x, mean(tests), width * 0.92, color=color, alpha=0.45,
                         label=None if label in labelled else label)
                labelled.add(label)
                left.plot([x] * len(tests), tests, "o", color=color, ms=4)
    left.set_xticks(range(len(shares)), [f"{100 * k:g} % kept" for k in shares])
    left.set_ylim(0.6, 0.95)
    left.set_ylabel("test accuracy (dots: seeds)")
    left.set_title("GCIDE field, MiniLM pruned while fine-tuned")
    left.legend(fontsize=7.5, loc="upper center", ncol=2)
    left.grid(axis="y", alpha=0.3)
    soft = [r for r in runs if r["method"] == "soft-movement" and r["by"]]
    for kept, style in zip(sorted({r["kept"] for r in soft}, reverse=True), ("-", "--")):
        these = [r["by"] for r in soft if r["kept"] == kept]
        layers = sorted({int(name.split(".")[0]) for name in these[0]})
        for kind, marker, color in zip(KINDS, "os^v", ("tab:blue", "tab:orange", "tab:green", "tab:red")):
            ys = [100 * mean(by[f"{layer}.{kind}"] for by in these) for layer in layers]
            right.plot(layers, ys, marker + style, color=color, label=f"{kind}, {100 * kept:g} % kept")
        right.axhline(100 * kept, color="black", lw=0.8, ls=style, alpha=0.5)
    right.axhline(100 * FLOOR, color="gray", lw=0.8, ls=":", label="floor (0.5 %)")
    right.set_yscale("log")
    right.set_xlabel("layer")
    right.set_ylabel("% of the matrix kept (mean over seeds)")
    right.set_title("Where soft movement keeps weights (black: the overall share)")
    right.legend(fontsize=7, ncol=2)
    right.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    """Gather, tabulate, draw."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help: nothing written
    runs, skipped, budget = gather()
    if not runs:
        raise SystemExit("no bench/results/movement_pruning_field*.json: "
                         "run bench/movement_vs_magnitude.py --task field first")
    rows = table(runs)
    lambdas = sweep()
    RESULT.write_text(json.dumps({"budget": budget, "skipped_other_budget": skipped, "rows": rows,
                                  "files": sorted({r["file"] for r in runs}), "soft_lambda_sweep": lambdas},
                                 indent=2) + "\n")
    plot(runs, PLOT, lambdas)
    for row in rows:
        print(f"{100 * row['kept']:4g} % kept  {row['method']:13s}  test {row['test']:.4f}  "
              f"valid {row['valid']:.4f}  seeds {row['seeds']}")
    for row in lambdas:
        print(f"{100 * row['kept']:4g} % kept  soft lambda {row['soft_lambda']:g}, seed {row['seed']}: "
              f"test {row['test']:.4f}  valid {row['valid']:.4f}")


if __name__ == "__main__":
    main()
