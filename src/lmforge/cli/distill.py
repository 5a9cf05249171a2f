"""`lmforge distill`: task-specific distillation of a fine-tuned encoder into a smaller student.

    lmforge distill --teacher runs/pos/best --train train.jsonl --valid dev.jsonl --data test.jsonl \\
        --out runs/pos-distil --steps 300 [--student-layers every-other|N | --student PRESET] \\
        temperature=2 alpha=0.5 gamma=0 lr=1e-4

The student copies every other teacher layer (or the first N; embeddings and task head too),
or is a preset's random model with a fresh head. key=value options: training (TrainConfig)
and the loss (temperature, alpha, gamma: DistillConfig). Prints teacher vs student (metric,
parameters, size on disk, forward time measured side by side) and writes OUT/distill.json.
"""
from __future__ import annotations

import re
from pathlib import Path

from lmforge.cli.common import SEED, STEPS, bounded, note, said


def _print(report: dict, out) -> None:
    """The teacher-vs-student table and the ratios."""
    from rich.console import Console
    from rich.table import Table

    from lmforge.compress.measure import forward_title

    table = Table(title=f"task distillation: {report['layers']['teacher']} -> "
                        f"{report['layers']['student']} layers")
    timed = forward_title(report[name] for name in ("teacher", "student"))
    for col in ("", "parameters", "weights MB", report["teacher"]["metric_name"], timed):
        table.add_column(col, justify="right")
    for name in ("teacher", "student"):
        r = report[name]
        table.add_row(name, f"{r['parameters']:,}", f"{r['bytes'] / 1e6:.1f}", f"{r['metric']:.4f}",
                      f"{r['seconds_b16']:.4f}")
    Console().print(table)
    kept = f"{100 * report['metric_kept']:.1f} %" if report["metric_kept"] is not None else "n/a"
    same = report["parameters_ratio"] == 1 and report["layers"]["teacher"] == report["layers"]["student"]
    # a student of the teacher's layers has no speed-up to claim: its time ratio is noise
    noise = f"the teacher's size (times {report['speedup']:.2f}x apart: noise)"
    timed = noise if same else speed(report["speedup"])
    print(f"student keeps {kept} of the teacher's {report['teacher']['metric_name']}, "
          f"{timed}, {report['parameters_ratio']:.2f}x the parameters; "
          f"student in {report['student_dir']}, report in {Path(out) / 'distill.json'}")


def speed(ratio: float) -> str:
    """The teacher's time over the student's in words: "1.52x faster", or "1.45x slower" below 1."""
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"


def _teacher_kind(teacher: str) -> str:
    """The task the teacher was fine-tuned for (its task.json); a one-line error naming --teacher."""
    import json

    from lmforge.cli.common import UsageError
    from lmforge.tasks.finetune import TASK_FILE, task_info
    from lmforge.tasks.reference import own_kind

    try:
        kind = own_kind(task_info(teacher))
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise UsageError(f"--teacher {teacher}: {TASK_FILE} is not a JSON object ({err})") from None
    if kind is None:
        raise UsageError(f"--teacher {teacher}: not a fine-tuned model directory (no task.json)")
    return kind


def _option_keys(options: dict) -> tuple:
    """(loss option names, training option names); an option that is neither is a UsageError."""
    from dataclasses import fields

    from lmforge.cli.common import unknown_options
    from lmforge.compress.task_distillation import LOSS
    from lmforge.train import TrainConfig

    loss_keys, train_keys = set(LOSS), {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(options) - loss_keys - train_keys)
    if unknown:
        raise unknown_options(unknown, (TrainConfig,), LOSS, "lmforge options distill")
    return loss_keys, train_keys


def distill_options(args, loss: dict):
    """The DistillConfig of the `loss` key=value options, --student-layers and --student (run_distill
    takes the same object): a bad flag value names its flag, a bad key=value one its key."""
    from lmforge.cli.common import from_flags
    from lmforge.compress.task_distillation import DistillConfig

    return from_flags(DistillConfig.from_dict,
                      {"student_layers": args.student_layers, "student": args.student}, loss)


def _configs(args) -> tuple:
    """(TrainConfig, DistillConfig) of --config, key=value and the flags (a flag wins), checked before any
    other file is looked at."""
    from lmforge.cli.common import parse_overrides, read_config_file, train_config

    options = {**read_config_file(args.config), **parse_overrides(args.overrides)}
    loss_keys, train_keys = _option_keys(options)
    return (train_config(args, {k: v for k, v in options.items() if k in train_keys}),
            distill_options(args, {k: v for k, v in options.items() if k in loss_keys}))


def cmd_distill(args) -> None:
    """Distil, print the teacher-vs-student table, write distill.json."""
    from lmforge.cli.common import UsageError, flag_named, read_records, refuse_overwrite
    from lmforge.compress.task_distillation import DISTILL_WRITES, check_teacher, run_distill
    from lmforge.train.run_folder import run_folder

    if args.student and args.student_layers:  # DistillConfig refuses it too, naming its fields
        raise UsageError("give --student-layers or --student, not both")
    if not args.data and not args.valid:
        raise UsageError("give --data FILE (or --valid FILE): the records teacher and student are scored on")
    train_cfg, cfg = _configs(args)
    # the one source model is the teacher (the student is its layers, or a preset's fresh weights)
    refuse_overwrite(args.out, ("--teacher", args.teacher), ("--train", args.train), ("--valid", args.valid),
                     ("--data", args.data), ("--config", args.config), writes=DISTILL_WRITES,
                     sources=("--teacher",))
    with flag_named("out", "--out", None):  # a run there already (or none to resume): before any read
        run_folder(args.out, args.resume)
    kind = _teacher_kind(args.teacher)
    with flag_named("teacher", "--teacher", None):  # the library names the field: "teacher DIR: why"
        check_teacher(args.teacher, kind, cfg.student)  # by its config.json, before the records and weights
    train = read_records("--train", args.train, kind, args.columns)
    valid = read_records("--valid", args.valid, kind, args.columns) if args.valid else None
    records = read_records("--data", args.data, kind, args.columns) if args.data else valid
    source = f"--data {args.data}" if args.data else f"--valid {args.valid}"
    with flag_named("student_layers", "--student-layers", args.student_layers), \
            flag_named("teacher", "--teacher", None):  # more layers than the teacher's; an int8 teacher
        report = run_distill(args.teacher, train, valid, records, args.out, train_cfg=train_cfg, cfg=cfg,
                             resume=args.resume, source=source, log=note)
    _print(report, args.out)


def add_parsers(sub) -> None:
    """Add the distill sub-command to the `lmforge` parser."""
    import argparse

    from lmforge.cli.options import options_epilog

    p = sub.add_parser("distill",
                       help="task-specific distillation of a fine-tuned encoder into a smaller student",
                       description=__doc__, epilog=options_epilog("distill"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", required=True, help="fine-tuned model directory (with task.json)")
    p.add_argument("--out", required=True,
                   help="the run's directory: its checkpoints, metrics.jsonl, the student (final/, best/) "
                        "and distill.json")
    p.add_argument("--train", required=True, help="labelled training file (the teacher's task)")
    p.add_argument("--valid", help="labelled validation file (best/ kept, metrics.jsonl); --valid or --data "
                                   "is required")
    said(p.add_argument("--data", help="labelled file teacher and student are scored on; --data or --valid "
                                       "is required"), "--valid")
    said(p.add_argument("--student-layers", help="every-other, or N: the teacher's first N layers"),
         "every-other")
    p.add_argument("--student", help="a preset instead: random init, fresh head")
    p.add_argument("--columns", help="field=column pairs, e.g. text=sentence,label=gold")
    p.add_argument("--steps", type=bounded(int, *STEPS), help="optimiser steps (the steps= option)")
    said(p.add_argument("--seed", type=bounded(int, *SEED),
                        help="fixes everything the run draws: a preset student's weights, the data order"), 0)
    p.add_argument("--config", help="YAML/JSON file of key: value options (a key=value or a flag given too "
                                    "wins)")
    p.add_argument("--resume", action="store_true", help="continue the newest checkpoint in --out")
    p.add_argument("overrides", nargs="*", help="key=value: training or loss options")
    p.set_defaults(func=cmd_distill)
    # the synopsis says that one of the two is required, which argparse's "[--valid] [--data]" does not
    p.usage = re.sub(r"\[--valid VALID\](\s+)\[--data DATA\]", r"(--valid VALID\1and/or --data DATA)",
                     p.format_usage().removeprefix("usage: ").rstrip())
