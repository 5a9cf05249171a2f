"""`lmforge prune`: structured pruning of a fine-tuned model (FFN neurons or attention heads), or
unstructured pruning during fine-tuning (magnitude, Zhu & Gupta 2017; movement and soft movement,
Sanh et al. 2020).

    lmforge prune --model runs/sst/best --method ffn --sparsity 0.5 --data dev.jsonl --out runs/ffn50
    lmforge prune --model all-MiniLM-L6-v2 --method movement --sparsity 0.9 --task cls \\
        --train train.jsonl --valid dev.jsonl --data test.jsonl --steps 1000 --out runs/mvp10 lr=1e-4

key=value options of magnitude / movement: training (TrainConfig), fine-tuning (TaskConfig) and
pruning (start, end: the cubic schedule's span as shares of the steps; scores_lr_scale; soft_lambda:
soft movement's L1 weight).
"""
from __future__ import annotations

from pathlib import Path

from lmforge.cli.common import SEED, STEPS, as_typed, bounded, note, said

UNSTRUCTURED = ("magnitude", "movement", "soft-movement")
# options a method does not use: refused, never ignored (structured methods prune without training)
UNUSED = {"structured": ("train", "valid", "steps", "resume", "seed", "config", "overrides"),
          "unstructured": ("importance_data",)}


def _refuse_unused(args) -> None:
    """A UsageError naming the first option given that --method does not use."""
    from lmforge.cli.common import UsageError

    kind = "unstructured" if args.method in UNSTRUCTURED else "structured"
    for name in UNUSED[kind]:
        if getattr(args, name) not in (None, False, []):
            option = "key=value options are" if name == "overrides" else f"--{name.replace('_', '-')} is"
            why = ("it ranks heads and FFN units only" if kind == "unstructured" else
                   "it prunes a fine-tuned model without training; the option is for magnitude / movement")
            raise UsageError(f"{option} not used by --method {args.method} ({why})")


def _refuse_a_run_there(args) -> None:
    """A UsageError naming --out where it holds a run's checkpoints without --resume (or none to resume), as
    finetune's: before any read; magnitude and movement train there, ffn and heads do not."""
    from lmforge.cli.common import flag_named
    from lmforge.train.run_folder import run_folder

    if args.method in UNSTRUCTURED:
        with flag_named("out", "--out", None):
            run_folder(args.out, args.resume)


def _check_sparsity(args) -> None:
    """--sparsity of ffn / heads within SparseConfig's declared bounds, (0, 1), as run_prune bounds it."""
    from lmforge.cli.common import flag_error
    from lmforge.compress.sparse_finetune import SparseConfig
    from lmforge.config.options import OptionsError, checked_as

    try:
        checked_as(SparseConfig, "sparsity", args.sparsity)
    except OptionsError as err:
        raise flag_error(err, {"sparsity": args.sparsity}) from None


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _table(title: str, rows: dict, extra: str = "") -> None:
    from rich.console import Console
    from rich.table import Table

    from lmforge.compress.measure import forward_title

    table = Table(title=title)
    metric = next((r["metric_name"] for r in rows.values() if r.get("metric_name")), "metric")
    for col in ("", "parameters", *(("nonzero",) if extra else ()), "weights MB", metric,
                forward_title(rows.values())):
        table.add_column(col, justify="right")
    for name, r in rows.items():
        nonzero = (f"{r['nonzero']:,}",) if extra else ()
        size = None if r.get("bytes") is None else r["bytes"] / 1e6
        table.add_row(name, f"{r['parameters']:,}", *nonzero, _cell(size, ".1f"), _cell(r["metric"], ".4f"),
                      f"{r['seconds_b16']:.4f}")
    Console().print(table)


def sparse_options(args, given: dict):
    """The SparseConfig of --method, --sparsity and the `given` key=value schedule options (SCHEDULE);
    a bad flag value names its flag, a bad key=value one its key."""
    from lmforge.cli.common import from_flags
    from lmforge.compress.sparse_finetune import SparseConfig

    return from_flags(SparseConfig.from_dict, {"method": args.method, "sparsity": args.sparsity}, given)


def _sparse_configs(args) -> tuple:
    """(TrainConfig, TaskConfig, SparseConfig) of magnitude / movement's --config, key=value and flags (a flag
    wins), checked before any file but --config is looked at."""
    from lmforge.cli.common import (UsageError, parse_overrides, read_config_file, train_config,
                                    unknown_options)
    from lmforge.cli.tasks import split_options
    from lmforge.compress.sparse_finetune import SCHEDULE
    from lmforge.tasks.finetune import TaskConfig
    from lmforge.train import TrainConfig

    if not args.train:
        raise UsageError(f"--method {args.method} fine-tunes while pruning: give --train FILE")
    given = {**read_config_file(args.config), **parse_overrides(args.overrides)}
    train_opts, task_opts, rest = split_options(given)
    sparse_opts = {k: rest.pop(k) for k in list(rest) if k in SCHEDULE}
    if rest:  # neither a training, a fine-tuning nor a schedule option: suggested from all three
        raise unknown_options(rest, (TrainConfig, TaskConfig), SCHEDULE, "lmforge options prune")
    sparse_cfg = sparse_options(args, sparse_opts)
    return train_config(args, train_opts), TaskConfig.from_dict(task_opts), sparse_cfg


def _unstructured(args, kind: str, records: list, configs: tuple) -> None:
    """Fine-tune with magnitude or movement pruning (configs: _sparse_configs); prints the table, writes
    prune.json."""
    from lmforge.cli.common import flag_named, read_records
    from lmforge.compress.sparse_finetune import run_sparse_prune

    train_cfg, task_cfg, sparse_cfg = configs
    train = read_records("--train", args.train, kind, args.columns)
    valid = read_records("--valid", args.valid, kind, args.columns) if args.valid else None
    with flag_named("sparsity", "--sparsity", None):  # a sparsity that rounds to no weight
        report = run_sparse_prune(args.model, kind, train, valid, records, args.out, train_cfg=train_cfg,
                                  sparse_cfg=sparse_cfg, task_cfg=task_cfg, resume=args.resume, log=note)
    ws = report["weight_sparsity"]
    rows = {name: {**report[name],
                   "nonzero": report[name]["parameters"] - (ws["zeros"] if name == "after" else 0)}
            for name in ("before", "after")}
    _table(f"{args.method} pruning: sparsity {args.sparsity} asked, {ws['sparsity']:.4f} of block weights "
           "zero", rows, "nonzero")
    if abs(ws["sparsity"] - args.sparsity) >= 5e-4:
        print(f"--sparsity {args.sparsity} rounds to {ws['sparsity']:.4f}: each matrix keeps whole weights"
              f"{' (and at least 0.5 % of its own)' if args.method == 'soft-movement' else ''}")
    if report["before"].get("metric_note"):
        print(f"before: {report['before']['metric_note']}")
    print(f"speed-up {report['speedup']:.2f}x: {report['note']}")
    print(f"model in {args.out}/final, report in {args.out}/prune.json")


def cmd_prune(args) -> None:
    """Prune, save under --out, print the before/after table; prune.json beside it."""
    from lmforge.cli.common import UsageError, check_task, flag_named, read_records, refuse_overwrite
    from lmforge.cli.tasks import check_model
    from lmforge.compress.model_files import replaced_line
    from lmforge.compress.prune_report import PRUNE_WRITES, refuse_quantised, run_prune
    from lmforge.compress.sparse_finetune import SPARSE_WRITES
    from lmforge.tasks.reference import saved_kind

    _refuse_unused(args)  # the options first: a bad one costs no file look-up
    check_task(args.task)
    configs = _sparse_configs(args) if args.method in UNSTRUCTURED else _check_sparsity(args)
    writes = (*SPARSE_WRITES, *PRUNE_WRITES)  # a magnitude run's and a structured one's
    refuse_overwrite(args.out, ("--model", args.model), ("--data", args.data),
                     ("--importance-data", args.importance_data), ("--train", args.train),
                     ("--valid", args.valid), ("--config", args.config), writes=writes, sources=("--model",))
    _refuse_a_run_there(args)
    check_model(args.model)  # named as --model, before it is read or any output folder is made
    refuse_quantised(args.model, "--model")
    kind = saved_kind(args.model, args.task)
    if kind is None:
        raise UsageError("--task is needed: the model directory has no task.json")
    records = read_records("--data", args.data, kind, args.columns)
    if args.method in UNSTRUCTURED:
        return _unstructured(args, kind, records, configs)
    extra = args.importance_data and read_records("--importance-data", args.importance_data, kind,
                                                  args.columns)
    existed = (Path(args.out) / "model").exists()
    with flag_named("sparsity", "--sparsity", None), flag_named("method", "--method", None):  # as flags
        report = run_prune(args.model, records, args.out, args.method, args.sparsity, kind, extra or None)
    removed = report["removed"]
    title = (f"{args.method} pruning: sparsity {args.sparsity} asked, {report['achieved_sparsity']:.4f} "
             f"removed ({removed['removed']} of {removed['of']} {removed['unit']})")
    _table(title, {n: report[n] for n in ("before", "after")})
    if "rounding" in report:
        print(report["rounding"])
    if existed:
        print(replaced_line(Path(args.out) / "model"))
    print(f"speed-up {report['speedup']:.2f}x; model in {args.out}/model, report in {args.out}/prune.json")


def add_parsers(sub) -> None:
    """Add the prune sub-command to the `lmforge` parser."""
    import argparse

    from lmforge.cli.options import options_epilog
    from lmforge.compress.prune_report import METHODS

    p = sub.add_parser("prune", help="structured pruning (FFN neurons or heads) that shrinks the matrices, "
                       "or magnitude / movement pruning during fine-tuning", description=__doc__,
                       epilog=options_epilog("prune"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a fine-tuned model directory (with task.json); magnitude "
                   "/ movement: also a pretrained model or a Hugging Face directory (then --task)")
    p.add_argument("--method", required=True, choices=METHODS + UNSTRUCTURED,
                   help="ffn: feed-forward units; heads: attention heads; magnitude / movement / "
                        "soft-movement: single weights of the blocks' Linears, pruned while fine-tuning")
    said(p.add_argument("--sparsity", required=True, type=as_typed(float), help="share removed"),
         bounds="(0, 1)")
    p.add_argument("--data", required=True, help="labelled data: the metric (and ffn / heads importance)")
    said(p.add_argument("--importance-data", help="ffn / heads: labelled data importance is estimated on"),
         "--data")
    said(p.add_argument("--task", help="task type"), "the model's task.json")
    p.add_argument("--columns", help="field=column pairs, e.g. text=sentence,label=gold")
    p.add_argument("--out", required=True, help="directory for the model and prune.json")
    p.add_argument("--train", help="magnitude / movement: training file")
    p.add_argument("--valid", help="magnitude / movement: validation file (the accuracy curve in "
                                   "metrics.jsonl)")
    p.add_argument("--steps", type=bounded(int, *STEPS), help="magnitude / movement: optimiser steps")
    said(p.add_argument("--seed", type=bounded(int, *SEED), help="magnitude / movement: the run's seed (data "
                        "order, a fresh head, a preset's init)"), 0)
    p.add_argument("--config", help="magnitude / movement: YAML/JSON file of key: value options (a key=value "
                                    "or a flag given too wins)")
    p.add_argument("--resume", action="store_true",
                   help="magnitude / movement: continue the newest checkpoint in --out")
    p.add_argument("overrides", nargs="*", help="key=value: training, fine-tuning or pruning options")
    p.set_defaults(func=cmd_prune)
