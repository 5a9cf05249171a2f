"""Task-specific distillation on a real model and a real task (DistilBERT's claim, at MiniLM's
scale): all-MiniLM-L6-v2 fine-tuned to tell a GCIDE headword's part of speech from its
definition is the teacher; a student of 3 of its 6 layers (every other one: 0, 2, 4, with the
embeddings and the task head) learns from its soft labels (T = 2, alpha = 0.5).

Targets (issue 21): the student keeps >= 97 % of the teacher's test accuracy and runs >= 1.6x
faster (forward at batch 16 on test definitions, and at 16 x 128 random ids; the two models
timed side by side in one process, median of alternating rounds).

    python -m bench.distill_minilm [--out /tmp/distill_minilm] [--per-label 600 --steps 240]

The teacher is fine-tuned as bench/heads_minilm.py does (same records, steps, seed) and cached
in OUT/teacher (or given with --teacher DIR). Writes bench/results/distill_minilm.json.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import lmforge
from bench.common import machine
from bench.heads_minilm import fine_tune  # the same teacher recipe
from bench.prune_speed import forward_medians
from lmforge.compress.task_distillation import DistillConfig, run_distill
from lmforge.data.dictionary import pos_task
from lmforge.train import TrainConfig

RESULT = Path(__file__).resolve().parent / "results" / "distill_minilm.json"


def long_batch_speed(dirs: list, rounds: int = 9) -> list:
    """Median seconds of a forward at 16 x 128 random ids per model, rounds alternating."""
    models = [lmforge.optimize(lmforge.load(d).eval()) for d in dirs]
    ids = torch.randint(1000, 20000, (16, 128), generator=torch.Generator().manual_seed(0))
    return forward_medians(models, ids, torch.ones_like(ids), rounds)


def main() -> None:
    """Fine-tune (or reuse) the teacher, distil, measure, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/distill_minilm")
    parser.add_argument("--teacher", help="a fine-tuned teacher directory (default: OUT/teacher, trained if absent)")
    parser.add_argument("--per-label", type=int, default=600)
    parser.add_argument("--teacher-steps", type=int, default=240)
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--gamma", type=float, default=0.0)
    args = parser.parse_args()
    out = Path(args.out)
    torch.manual_seed(0)
    records = pos_task(args.per_label, seed=0)
    start = time.perf_counter()
    teacher, origin = (Path(args.teacher), "given (--teacher)") if args.teacher else (None, "cached in OUT/teacher")
    if teacher is None:
        done = [out / "teacher" / d for d in ("best", "final") if (out / "teacher" / d / "task.json").is_file()]
        if not done:
            origin = f"fine-tuned here ({args.teacher_steps} steps, bench/heads_minilm.py's recipe)"
        teacher = done[0] if done else fine_tune(records, out / "teacher", args.teacher_steps)
    teacher_seconds = time.perf_counter() - start
    cfg = TrainConfig(steps=args.steps, batch_size=32, lr=args.lr, warmup=max(1, args.steps // 10), seed=0,
                      progress=False, log_every=max(1, args.steps // 12), eval_every=max(1, args.steps // 6))
    loss = DistillConfig(temperature=2.0, alpha=0.5, gamma=args.gamma, student_layers="every-other")
    report = run_distill(teacher, records["train"], records["validation"], records["test"], out / "student",
                         train_cfg=cfg, cfg=loss, log=lambda *a: None)
    t_long, s_long = long_batch_speed([teacher, report["student_dir"]])
    result = {"task": "GCIDE part of speech from definition (noun/verb/adjective/adverb)",
              "records": {k: len(v) for k, v in records.items()}, "machine": machine(),
              "threads": torch.get_num_threads(),
              "teacher_origin": origin, "teacher_seconds": teacher_seconds, **report,
              "speed_16x128": {"teacher_s": t_long, "student_s": s_long, "speedup": t_long / s_long},
              "targets": {"metric_kept": ">= 0.97", "speedup": ">= 1.6"}}
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    t, s = report["teacher"], report["student"]
    print(f"teacher {t['metric']:.4f}  student {s['metric']:.4f}  kept {report['metric_kept']:.3f}  "
          f"speed-up {report['speedup']:.2f}x (test batch 16), {t_long / s_long:.2f}x (16x128)  "
          f"params {report['parameters_ratio']:.2f}x  size {report['bytes_ratio']:.2f}x  "
          f"distillation {report['train_seconds']:.0f}s")


if __name__ == "__main__":
    main()
