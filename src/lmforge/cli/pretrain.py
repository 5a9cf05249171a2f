"""`lmforge pretrain`: pretrain a preset (or distil a teacher) with an objective."""
from __future__ import annotations

from pathlib import Path

from lmforge import objectives
from lmforge.cli.common import UsageError, parse_overrides, read_config_file, split_overrides
from lmforge.io import load as load_model


def cmd_pretrain(args) -> None:
    """Pretrain a preset with an objective; metrics, checkpoints, plots and DIR/final under --out."""
    from lmforge.tokenizer import load_tokenizer
    from lmforge.train import TrainConfig
    from lmforge.train.pretrain import pretrain

    train, model = split_overrides({**read_config_file(args.config), **parse_overrides(args.overrides)})
    train = TrainConfig.from_dict({"seed": args.seed, **({"steps": args.steps} if args.steps else {}), **train})
    if (args.preset is None) == (args.teacher is None):
        raise UsageError("give --preset, or --teacher DIR with --objective distillation (the student is "
                         "every other teacher layer)")
    teacher = load_model(args.teacher) if args.teacher else None
    source = args.tokenizer or args.teacher  # a student reads with its teacher's tokenizer
    tokenizer = load_tokenizer(source) if source else None
    pretrain(args.preset, args.objective, args.out, train, files=args.data, tokenizer=tokenizer,
             overrides=model, resume=args.resume, duplication=args.duplication, teacher=teacher)
    print(f"wrote {Path(args.out) / 'final'}")


def objective_help() -> str:
    """--objective's help: every registered objective with its summary, then the aliases. The parser is
    built on each run (cli.main), so an objective registered before then is listed and accepted."""
    listed = "; ".join(f"{s.name}: {s.summary}" if s.summary else s.name for s in objectives.specs())
    aliases = ", ".join(f"{alias}={name}" for alias, name in objectives.aliases().items())
    return f"{listed} (aliases: {aliases})" if aliases else listed


def add_parsers(sub) -> None:
    """Add pretrain to the main parser."""
    p = sub.add_parser("pretrain", help="pretrain a model (built-in corpus by default)")
    p.add_argument("--preset", help="preset name (see `lmforge presets`); not with --teacher")
    p.add_argument("--objective", required=True, choices=(*objectives.names(), *objectives.aliases()),
                   metavar="NAME", help=objective_help())
    p.add_argument("--teacher", help="distillation: the teacher's model directory (with its MLM head and tokenizer)")
    p.add_argument("--duplication", type=int, default=0,
                   help="static masking: each example's corruption fixed in this many copies (BERT: 10); "
                        "0 (default): dynamic, drawn anew each epoch (RoBERTa)")
    p.add_argument("overrides", nargs="*", help="key=value: training options or model config fields")
    p.add_argument("--config", help="YAML/JSON file of the same keys")
    p.add_argument("--data", nargs="*", help="plain-text files (default: the built-in corpus)")
    p.add_argument("--tokenizer", help="tokenizer directory (default: train one on the corpus)")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue the newest checkpoint in --out")
    p.set_defaults(func=cmd_pretrain)
