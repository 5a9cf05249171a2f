"""REALM against the same salient-span MLM without retrieval, at equal steps (Guu et al. 2020's
"does retrieval help fill in world knowledge" on the built-in corpus): all-MiniLM-L6-v2 as the
knowledge-augmented encoder (a fresh MLM head) and as Embed_input / Embed_doc, held-out documents'
masked names and dates scored by span accuracy, log p(y | x) and answer recall of the retrieved top k.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.realm --steps 150 [--arms realm,no_retrieval]
writes bench/results/realm.json and bench/plots/realm.png (training loss, held-out scores). With
--reader runs/realm_bench/no_retrieval/final both arms start from a reader already trained on
salient-span MLM (its MLM head warm, as REALM's BERT is):

    .venv/bin/python -m bench.realm --reader runs/realm_bench/no_retrieval/final --runs runs/realm_warm \
        --out bench/results/realm_warm.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bench.common import machine
from lmforge.retrieval.job_options import RealmOptions
from lmforge.retrieval.jobs import run_realm
from lmforge.train import TrainConfig

HERE = Path(__file__).resolve().parent
ARMS = {"realm": {"k": 4}, "no_retrieval": {"k": 0}}  # k = 0: the null document only, i.e. plain SSM


def arm(name: str, args) -> dict:
    """One arm's run (its own output directory) and its wall time."""
    cfg = TrainConfig(steps=args.steps, batch_size=8, lr=args.lr, warmup=10, log_every=5, seed=args.seed,
                      progress=False, eval_every=0)
    start = time.perf_counter()
    options = RealmOptions(k=ARMS[name]["k"], refresh_every=args.refresh_every)
    result = run_realm(args.reader, Path(args.runs) / name, cfg, retriever=args.retriever, options=options,
                       log=lambda m: None)
    return {**result, "wall_s": round(time.perf_counter() - start, 1)}


def plot(runs: Path, result: dict, path: Path) -> None:
    """Training loss of each arm against the step, and the held-out scores after training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    arms = list(result["arms"])
    for name in arms:
        rows = [json.loads(x) for x in (runs / name / "metrics.jsonl").read_text().splitlines()]
        axes[0].plot([r["step"] for r in rows], [r["loss"] for r in rows], label=name)
    axes[0].set(xlabel="step", ylabel="-log p(y | x), training batch of 8", title="salient-span loss (same batches)")
    keys = ("span_accuracy", "token_accuracy", "answer_recall")
    width = 0.8 / len(arms)
    for i, name in enumerate(arms):
        after = result["arms"][name]["after"]
        bars = axes[1].bar([k + i * width for k in range(len(keys))], [after[k] for k in keys], width, label=name)
        axes[1].bar_label(bars, fmt="%.3f", fontsize=8)
    axes[1].set_xticks([k + width * (len(arms) - 1) / 2 for k in range(len(keys))], [k.replace("_", " ") for k in keys])
    n = result["arms"][arms[0]]["test_examples"]
    axes[1].set(ylabel="share", title=f"held-out documents' masked spans ({n}), after {result['steps']} steps")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def rescore(runs: Path, result: dict, seed: int) -> None:
    """Score each arm's saved encoder and retriever again on the held-out spans with an index built
    from its final Embed_doc (runs before the fix in run_realm scored "after" with an index up to
    refresh_every forward passes stale); result's "after" replaced, the stale one kept beside it."""
    from lmforge.io import load
    from lmforge.retrieval.dpr import BiEncoder
    from lmforge.retrieval.passages import load_passages
    from lmforge.retrieval.realm import REALMObjective, evaluate_realm
    from lmforge.retrieval.jobs import realm_examples

    passages = load_passages(None, seed)
    for name, arm in result["arms"].items():
        encoder = BiEncoder.from_dir(runs / name / "retriever")
        examples = realm_examples(encoder.tokenizer, passages, seed)["test"]
        objective = REALMObjective(load(runs / name / "final"), encoder, passages, arm["k"], arm["refresh_every"])
        arm["after_stale_index"] = arm.get("after_stale_index", arm["after"])
        arm["after"] = evaluate_realm(objective, examples, passages)


def _plot_path(out: str) -> Path:
    return HERE / "plots" / (Path(out).stem + ".png")


def main() -> None:
    """Run the arms (or redraw / rescore saved ones) and print their held-out scores."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--refresh-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--runs", default="runs/realm_bench")
    parser.add_argument("--out", default=str(HERE / "results" / "realm.json"))
    parser.add_argument("--reader", default="all-MiniLM-L6-v2",
                        help="the knowledge-augmented encoder to start from (e.g. a no_retrieval arm's final/: warm)")
    parser.add_argument("--retriever", default="all-MiniLM-L6-v2",
                        help="Embed_input / Embed_doc to start from (e.g. lmforge retrieve ict's final/)")
    parser.add_argument("--plot-only", action="store_true", help="redraw the plot from --out and --runs")
    parser.add_argument("--rescore", action="store_true", help="score --runs' saved arms again (fresh index)")
    args = parser.parse_args()
    if args.rescore:
        result = json.loads(Path(args.out).read_text())
        rescore(Path(args.runs), result, args.seed)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        return plot(Path(args.runs), result, _plot_path(args.out))
    if args.plot_only:
        return plot(Path(args.runs), json.loads(Path(args.out).read_text()), _plot_path(args.out))
    arms = args.arms.split(",")
    if set(arms) - set(ARMS) or args.steps < 1 or args.refresh_every < 1:
        parser.error(f"--arms of {', '.join(ARMS)}; --steps and --refresh-every at least 1")
    result = {"model": "all-MiniLM-L6-v2", "reader": args.reader, "retriever": args.retriever, "corpus": "built-in", "steps": args.steps, "batch_size": 8,
              "lr": args.lr, "threads": torch.get_num_threads(), "torch": torch.__version__,
              "machine": machine(), "arms": {}}
    for name in arms:
        result["arms"][name] = arm(name, args)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    plot(Path(args.runs), result, _plot_path(args.out))
    print(json.dumps({n: r["after"] for n, r in result["arms"].items()}, indent=2))


if __name__ == "__main__":
    main()
