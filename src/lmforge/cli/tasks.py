"""`lmforge finetune` and `lmforge evaluate` (added to the main parser by `add_parsers`).

    lmforge finetune --model DIR --task cls --train train.csv --valid dev.csv \\
        --columns text=sentence,label=gold --out runs/sst --steps 500 lr=3e-5 patience=3
    lmforge finetune --model runs/bert/final --builtin sentiment --out runs/sentiment --steps 300
    lmforge evaluate --model runs/sst/best --data test.csv --out predictions.jsonl

key=value overrides are training options (TrainConfig), fine-tuning options (TaskConfig:
max_len, freeze_embeddings, freeze_layers, freeze_backbone, layer_decay, patience,
keep_best, eval_batch_size, text_to_text, prefix, num_beams, max_new_tokens, ...) or, for a
preset, model config fields.
An encoder-decoder fine-tunes cls / pair / regression text-to-text where its family has no
classification head (T5) or when given text_to_text=true (BART), e.g.

    lmforge finetune --model t5-dir --task pair --train mnli.csv --out runs/mnli prefix=mnli

--task seq2seq trains source -> target (summarisation, translation: CSV/JSONL with source and target
columns) with teacher forcing and scores generated text by BLEU and ROUGE, e.g. a T5 checkpoint or
the Transformer of Vaswani et al. from scratch (a preset: sized to --tokenizer):

    lmforge finetune --model t5-dir --task seq2seq --train news.jsonl --valid dev.jsonl \
        --columns source=article,target=highlights --out runs/sum prefix=summarize num_beams=4
    lmforge finetune --model transformer-base --tokenizer bpe-dir --task seq2seq --train en-de.csv \
        --out runs/ende --steps 100000

--task rerank trains a cross-encoder (one score per query and document) on JSONL records of a query, its
positive and its negatives (and a teacher's "scores" for loss=distill), validated by MRR@10 and recall@1:

    lmforge finetune --model all-MiniLM-L6-v2 --task rerank --train pairs.jsonl --valid dev.jsonl \
        --out runs/rerank loss=listwise negatives=7
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from lmforge.cli.common import SEED, STEPS, bounded, said
from lmforge.tasks.formats import BUILTIN_SIZE

KINDS = ("cls", "pair", "regression", "choice", "multilabel", "tagging", "qa", "seq2seq", "rerank")
SPLITS = ("train", "validation", "test")
BUILTIN_RECORDS = 1000  # --builtin-size unless given


def split_options(pairs: dict) -> tuple:
    """key=value overrides -> (TrainConfig keys, TaskConfig keys, model config fields)."""
    from dataclasses import fields

    from lmforge.tasks.finetune import TaskConfig
    from lmforge.train import TrainConfig

    train_keys = {f.name for f in fields(TrainConfig)}
    task_keys = {f.name for f in fields(TaskConfig)}
    return ({k: v for k, v in pairs.items() if k in train_keys},
            {k: v for k, v in pairs.items() if k in task_keys},
            {k: v for k, v in pairs.items() if k not in train_keys | task_keys})


def refuse_unknown_keys(model: dict) -> None:
    """Refuse the key=value options that are no training, fine-tuning nor model option (learning_rate), as
    pretrain does: the model config's field list alone (a preset's) or "apply to presets only" (a folder's)
    would mislead."""
    from lmforge.cli.common import unknown_options
    from lmforge.config import ModelConfig
    from lmforge.tasks.finetune import TaskConfig
    from lmforge.train import TrainConfig

    unknown = sorted(set(model) - set(ModelConfig.__dataclass_fields__))
    if unknown:  # suggested from all three (learning_rat lands here); listed where TaskConfig's are
        raise unknown_options(unknown, (TaskConfig, TrainConfig, ModelConfig))


def task_data(args, labelled: bool = True) -> tuple:
    """(kind, {split: records}) from --builtin or the files given (--train/--valid or --data)."""
    from lmforge.cli.common import UsageError, read_records
    from lmforge.tasks.formats import BUILTIN, builtin

    check_source(args)
    if args.builtin:
        size = BUILTIN_RECORDS if args.builtin_size is None else args.builtin_size
        kind, splits = builtin(args.builtin, size, 0 if args.seed is None else args.seed)
        if args.task and args.task != kind:
            raise UsageError(f"--builtin {args.builtin} is a {kind} task, not {args.task}")
        return kind, splits
    if not args.task:
        raise UsageError(f"--task is needed with data files (or use --builtin {'|'.join(BUILTIN)})")
    files = {"train": ("--train", getattr(args, "train", None)),
             "validation": ("--valid", getattr(args, "valid", None)),
             "test": ("--data", getattr(args, "data", None))}
    read = _read_rerank if args.task == "rerank" else read_records
    return args.task, {split: read(option, f, args.task, args.columns, labelled or split == "train")
                       for split, (option, f) in files.items() if f}


def check_source(args) -> None:
    """A UsageError naming a flag that the records' source does not read: a file or --columns beside
    --builtin (its records are its own), --builtin-size or --split without it."""
    from lmforge.cli.common import UsageError

    if args.builtin:
        files = [flag for flag in ("--train", "--valid", "--data", "--columns")
                 if getattr(args, flag[2:], None) is not None]
        if files:
            raise UsageError(f"{files[0]}: --builtin {args.builtin} brings its own records; give files or "
                             "--builtin, not both")
        return
    for flag in ("--builtin-size", "--split"):
        if getattr(args, flag[2:].replace("-", "_"), None) is not None:
            raise UsageError(f"{flag}: it is for a --builtin task's records; give --builtin NAME too")


def _read_rerank(option: str, path, kind: str, columns, labelled: bool) -> list:
    """Rerank records (tasks/rerank.py: JSONL of query, positive, negatives[, scores]); --columns has no
    say."""
    from lmforge.cli.common import UsageError
    from lmforge.tasks.rerank import read_rerank

    if columns:
        raise UsageError("--columns: rerank records name their fields query, positive, negatives "
                         "(and scores)")
    try:
        return read_rerank(path, labelled)
    except OSError as err:
        raise UsageError(f"{option} {path}: {err.strerror or err}") from None


def check_model(name: str) -> None:
    """Refuse, naming --model, a name that is no preset, installed model or model directory: a path
    that does not exist, a file, a folder without config.json."""
    from pathlib import Path

    from lmforge.cli.common import UsageError
    from lmforge.io import model_dir
    from lmforge.io.resolve import elmo_preset_said
    from lmforge.presets import ELMO_PRESETS, PRESETS
    from lmforge.utils.model_folder import inside_job_folder

    path = Path(name)
    if name in PRESETS or (not path.exists() and model_dir(name) is not None):
        return  # a preset, or an installed model package
    if name in ELMO_PRESETS and not path.exists():
        raise UsageError(f"--model {elmo_preset_said(name)}")
    if not path.exists():
        looks_like_path = "/" in name or os.sep in name or name.startswith(".")
        raise UsageError(f"--model {name}: no such directory" + ("" if looks_like_path else
                         " (nor a preset name or an installed model)"))
    if not path.is_dir():
        raise UsageError(f"--model {name}: is a file, not a model directory")
    if not (inside_job_folder(path) / "config.json").is_file():  # a job's --out folder: the model in it
        raise UsageError(f"--model {name}: is not a model directory: config.json is missing")


def cmd_finetune(args) -> None:
    """Fine-tune a model on a task; metrics, best/ and final/ under --out; prints the summary."""
    from lmforge.cli.common import (UsageError, flag_named, note, parse_overrides, read_config_file,
                                    refuse_overwrite, train_config)
    from lmforge.train.checkpoint import RUN_FILES
    from lmforge.train.run_folder import run_folder
    from lmforge.io import model_dir
    from lmforge.tasks.finetune import TaskConfig, finetune, load_model
    from lmforge.tasks.formats import check_labels, label_set
    from lmforge.train.pretrain import rank_zero

    # the options first, as distill and prune check theirs: a bad one costs no file look-up
    train, task, model = split_options({**read_config_file(args.config), **parse_overrides(args.overrides)})
    refuse_unknown_keys(model)
    train, task = train_config(args, train), TaskConfig.from_dict(task)
    args.seed = train.seed  # the run's: it splits a built-in task, inits a preset
    refuse_overwrite(args.out, ("--train", args.train), ("--valid", args.valid), ("--model", args.model),
                     ("--tokenizer", args.tokenizer), ("--config", args.config), writes=RUN_FILES)
    with flag_named("out", "--out", None):  # a run there already (or none to resume): before any read
        run_folder(args.out, args.resume)
    if not args.builtin and not args.train:
        raise UsageError("give --train FILE (and --valid FILE), or --builtin NAME")
    check_model(args.model)
    kind, splits = task_data(args)
    if model and model_dir(args.model) is not None:
        raise UsageError(f"unknown option(s) {sorted(model)} (model config fields apply to presets only)")
    valid = splits.get("validation")
    if valid and args.valid and kind in ("cls", "pair"):  # the check again, naming the file
        check_labels(valid, label_set(splits["train"]), args.valid)
    net, tokenizer = load_model(args.model, args.tokenizer, model, seed=args.seed)
    # notes on stderr: stdout holds the summary; under torchrun every rank gets here, rank 0 alone says it
    summary = finetune(net, tokenizer, kind, splits["train"], valid, args.out, train, task,
                       resume=args.resume, log=rank_zero(note))
    rank_zero(print)(json.dumps(summary, indent=2))


def cmd_evaluate(args) -> None:
    """Score a fine-tuned model on a labelled file (or a built-in split); predictions to --out."""
    from lmforge.cli.common import UsageError, refuse_overwrite
    from lmforge.tasks.finetune import evaluate, task_info
    from lmforge.tasks.reference import own_kind
    from lmforge.tasks.formats import check_labels, gold_given

    refuse_overwrite(args.out, ("--data", args.data), ("--model", args.model),
                     ("--tokenizer", args.tokenizer), kind="file")
    if not args.builtin and not args.data:
        raise UsageError("give --data FILE or --builtin NAME")
    check_model(args.model)  # before task.json is looked for in it
    if not args.task and not args.builtin:
        args.task = own_kind(task_info(args.model))  # the fine-tuned model's own task
    kind, splits = task_data(args, labelled=False)
    records = splits[(args.split or "validation") if args.builtin else "test"]
    labelled = gold_given(records, args.data or f"--builtin {args.builtin}")  # a mix is refused, named
    labels = task_info(args.model).get("labels")
    if args.data and labels and kind in ("cls", "pair"):
        check_labels(records, labels, args.data)
    metrics = evaluate(args.model, records, kind, tokenizer=args.tokenizer, out=args.out,
                       batch_size=args.batch_size)
    print(json.dumps({"task": kind, "records": len(records), **metrics}, indent=2))
    if not labelled:
        print("no metrics: the records carry no labels (predictions only"
              + (", written to --out)" if args.out else "; give --out FILE to keep them)"), file=sys.stderr)
    if args.out:
        print(f"wrote {args.out}")


def _common(p) -> None:
    p.add_argument("--model", required=True, help="a model directory (lmforge or Hugging Face), an installed "
                   "model (all-MiniLM-L6-v2), or a preset (random weights from --seed; give --tokenizer)")
    said(p.add_argument("--task", choices=KINDS, help="task type"), "with --builtin, the task's own")
    p.add_argument("--builtin", choices=("sentiment", "entailment", "tagging", "questions"),
                   help="a built-in corpus task instead of files")
    said(p.add_argument("--builtin-size", type=bounded(int, *BUILTIN_SIZE),
                        help="records of the built-in task (80/10/10)"), BUILTIN_RECORDS)
    p.add_argument("--columns", help="field=column pairs, e.g. text=sentence,label=gold or "
                   "source=article,target=summary")
    said(p.add_argument("--tokenizer", help="tokenizer directory"), "the model directory's")
    said(p.add_argument("--seed", type=bounded(int, *SEED),
                        help="fixes everything the run draws: the built-in task, a preset's weights, a fresh "
                             "head, the data order"), 0)


def add_parsers(sub) -> None:
    """Add the finetune and evaluate sub-commands to the `lmforge` parser."""
    from lmforge.cli.options import options_epilog

    p = sub.add_parser("finetune", help="fine-tune a model on a labelled task",
                       epilog=options_epilog("finetune"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.add_argument("--train", help="training file (.csv, .tsv, .jsonl; CoNLL for tagging, SQuAD JSON for qa)")
    p.add_argument("--valid", help="validation file, same format")
    p.add_argument("--out", required=True, help="the run's directory: checkpoints, metrics.jsonl, final/")
    p.add_argument("--steps", type=bounded(int, *STEPS), help="optimiser steps (the steps= option)")
    p.add_argument("--config", help="YAML/JSON file of key: value options (a key=value or a flag given too "
                                    "wins)")
    p.add_argument("--resume", action="store_true", help="continue the newest checkpoint in --out")
    p.add_argument("overrides", nargs="*", help="key=value: training, fine-tuning or model options")
    p.set_defaults(func=cmd_finetune)
    p = sub.add_parser("evaluate", help="score a fine-tuned model and write its predictions")
    _common(p)
    p.add_argument("--data", help="file to evaluate (same formats as finetune)")
    said(p.add_argument("--split", choices=SPLITS, help="the --builtin split"), "validation")
    p.add_argument("--out", help="predictions file (JSON lines)")
    p.add_argument("--batch-size", type=bounded(int, 1, 65536), default=64, help="examples scored at once")
    p.set_defaults(func=cmd_evaluate)
