"""Movement vs magnitude pruning during fine-tuning (Sanh, Wolf & Rush 2020, fig. 2's comparison)
on a real model and task: all-MiniLM-L6-v2, pretrained, fine-tuned to tell a GCIDE headword's
part of speech from its definition while its blocks' Linear weights are pruned to 10 % and 3 %
of them kept (cubic schedule from 10 % to 70 % of the steps, then held).

The paper's claim: at high sparsity (< 15 % kept) movement pruning beats magnitude pruning.
Its budget was 10 epochs of SQuAD / MNLI; here the budget is small (--steps at batch 32,
about 2 epochs of --per-label x 4 x 0.8 definitions), which favours neither method on paper
but leaves the scores little time to learn: the ordering found is reported as it comes out.

    python -m bench.movement_vs_magnitude [--out /tmp/movement] [--steps 80 --per-label 400]
                                          [--prune-start 0.1 --prune-end 0.7] [--task pos|field]
                                          [--methods magnitude movement soft-movement]

--task field asks a harder question of the same definitions: the field of knowledge a definition is
marked with (eight fields whose vocabularies overlap: zoology, botany, anatomy, medicine, ...), where
a part-of-speech model keeps ~95 % even with 3 % of its weights (magnitude) and cannot tell the
methods apart.

The reference run (masked_run_squad.py: 10 epochs, warmup_steps 5400 ~ one epoch of SQuAD at
batch 16, initial_warmup 1, final_warmup 2) prunes from 10 % to 80 % of its steps, after one
epoch in which the scores only learn; `--steps 400 --prune-end 0.8` is that budget here (ten
epochs of the 1280 training definitions, the first cut after one).

Writes bench/results/movement_pruning.json (test accuracy, validation curves, wall clock of
each run) and bench/plots/movement_pruning.png.
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

import lmforge
from bench.common import machine
from lmforge.compress.sparse_finetune import SparseConfig, prune_finetune
from lmforge.compress.sparsity import kept_by_matrix as shares
from lmforge.data.dictionary import field_task, pos_task
from lmforge.tasks.finetune import TaskConfig, evaluate
from lmforge.train import TrainConfig

HERE = Path(__file__).resolve().parent
RESULT, PLOT = HERE / "results" / "movement_pruning.json", HERE / "plots" / "movement_pruning.png"
TASKS = {"pos": (pos_task, "GCIDE part of speech from definition"),  # --task: (records, name)
         "field": (field_task, "GCIDE field of knowledge from definition (8 fields, the mark removed)")}


def run(method: str, sparsity: float, records: dict, out: Path, args) -> dict:
    """One fine-tuning with pruning; its test accuracy, curve and wall clock."""
    shutil.rmtree(out, ignore_errors=True)
    cfg = TrainConfig(steps=args.steps, batch_size=32, lr=args.lr, warmup=max(1, args.steps // 10), seed=args.seed,
                      progress=False, log_every=max(1, args.steps // 12), eval_every=max(1, args.steps // 5))
    start = time.perf_counter()
    summary = prune_finetune("all-MiniLM-L6-v2", "cls", records["train"], records["validation"], out, train_cfg=cfg,
                             sparse_cfg=sparse_config(args, method, sparsity), task_cfg=TaskConfig(max_len=64),
                             log=lambda *a: None)
    seconds = time.perf_counter() - start
    test = evaluate(out / "final", records["test"])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [{"step": r["step"], "sparsity": r["sparsity"], "valid_accuracy": r["valid_accuracy"]}
             for r in rows if "valid_accuracy" in r]
    return {"method": method, "kept": round(1 - sparsity, 4), "test_accuracy": test["accuracy"],
            "valid_accuracy": summary["final"]["accuracy"], "weight_sparsity": summary["sparsity"],
            "train_seconds": summary["seconds"], "wall_seconds": seconds, "curve": curve,
            "kept_by_matrix": kept_by_matrix(out / "final")}


def kept_by_matrix(model_dir: Path) -> dict:
    """The share of each block Linear's weights left nonzero, by "layer.matrix"."""
    model = lmforge.load(model_dir)
    return {name.removeprefix("encoder.blocks."): share for name, share in shares(model).items()}


def sparse_config(args, method: str, sparsity: float) -> SparseConfig:
    """The pruning options of the command line for one run."""
    return SparseConfig(method=method, sparsity=sparsity, start=args.prune_start, end=args.prune_end,
                        scores_lr_scale=args.scores_lr_scale, soft_lambda=args.soft_lambda)


def schedule(args) -> str:
    """The schedule in words, as the JSON and the plot say it."""
    return f"cubic, {100 * args.prune_start:g} % -> {100 * args.prune_end:g} % of steps"


def plot(runs: list, path: Path, args) -> None:
    """Validation accuracy against the step, one line per method and sparsity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4), dpi=120)
    for r in runs:
        style = {"movement": "o-", "soft-movement": "^-."}.get(r["method"], "s--")
        ax.plot([p["step"] for p in r["curve"]], [p["valid_accuracy"] for p in r["curve"]], style,
                label=f"{r['method']}, {100 * r['kept']:g} % kept (test {r['test_accuracy']:.3f})")
    ax.set_xlabel(f"step (sparsity: {schedule(args)})")
    ax.set_ylabel("validation accuracy")
    ax.set_title(f"Movement vs magnitude pruning, MiniLM on GCIDE {'part of speech' if args.task == 'pos' else 'field'}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def write(runs: list, records: dict, args) -> None:
    """The JSON of the runs so far, with movement minus magnitude where both ran."""
    by = {(r["method"], r["kept"]): r["test_accuracy"] for r in runs}
    minus = {f"{method}_minus_magnitude": {f"{100 * k:g}% kept": by[(method, k)] - by[("magnitude", k)]
                                           for k in args.kept if (method, k) in by and ("magnitude", k) in by}
             for method in ("movement", "soft-movement")}
    result = {"task": TASKS[args.task][1], "model": "all-MiniLM-L6-v2 (pretrained)",
              "records": {k: len(v) for k, v in records.items()}, "machine": machine(),
              "threads": torch.get_num_threads(),
              "seed": args.seed, "budget": {"steps": args.steps, "batch_size": 32, "lr": args.lr,
                         "scores_lr": args.lr * args.scores_lr_scale, "schedule": schedule(args),
                         **({"soft_lambda": args.soft_lambda} if "soft-movement" in args.methods else {})},
              **{name: d for name, d in minus.items() if d}, "runs": runs}
    Path(args.result).parent.mkdir(parents=True, exist_ok=True)
    Path(args.result).write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    """The runs (--methods x --kept), the JSON and the plot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/movement")
    parser.add_argument("--task", choices=sorted(TASKS), default="pos",
                        help="pos: part of speech (4 labels); field: field of knowledge (8 labels, harder)")
    parser.add_argument("--per-label", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0, help="the training seed (head init, batch order); "
                        "the data's splits stay those of seed 0")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--scores-lr-scale", type=float, default=100.0)
    parser.add_argument("--soft-lambda", type=float, default=400.0, help="soft movement's L1 weight")
    parser.add_argument("--methods", nargs="+", choices=("magnitude", "movement", "soft-movement"),
                        default=["magnitude", "movement"], help="the runs at each sparsity (magnitude is "
                        "deterministic for a seed: a run of another method compares with its earlier JSON)")
    parser.add_argument("--prune-start", type=float, default=0.1, help="share of the steps before the first cut")
    parser.add_argument("--prune-end", type=float, default=0.7, help="share of the steps at the final sparsity")
    parser.add_argument("--kept", type=float, nargs="+", default=[0.1, 0.03], help="shares of weights kept")
    parser.add_argument("--result", default=str(RESULT), help="where the JSON goes")
    args = parser.parse_args()
    sparsities = [round(1 - k, 4) for k in args.kept]
    try:  # every run's options, before the first one trains
        for sparsity in sparsities:
            for method in args.methods:
                sparse_config(args, method, sparsity)
    except ValueError as e:
        parser.error(f"--prune-start/--prune-end/--kept: {e}")
    torch.manual_seed(args.seed)
    records = TASKS[args.task][0](args.per_label, seed=0)
    runs: list = []
    for sparsity in sparsities:
        for method in args.methods:
            runs.append(run(method, sparsity, records, Path(args.out) / f"{method}-{sparsity}", args))
            r = runs[-1]
            print(f"{method:13s} {100 * r['kept']:4.1f}% kept  test {r['test_accuracy']:.4f}  "
                  f"valid {r['valid_accuracy']:.4f}  {r['train_seconds']:.0f}s", flush=True)
            write(runs, records, args)  # after each run: a cut-off bench keeps what it measured
    plot(runs, PLOT.with_name(Path(args.result).stem + ".png"), args)  # bench/plots/, named as the JSON
    print(json.dumps({k: v for k, v in json.loads(Path(args.result).read_text()).items() if "_minus_" in k},
                     indent=2))


if __name__ == "__main__":
    main()
