"""`lmforge tokenizer train`: train a WordPiece, BPE, byte-level BPE or unigram tokenizer."""
from __future__ import annotations

from pathlib import Path

from lmforge.cli.common import SEED, bounded


def cmd_tokenizer_train(args) -> None:
    """Train a tokenizer on text files (default: the built-in corpus) and save it under --out."""
    from lmforge.cli.common import UsageError, refuse_overwrite
    from lmforge.data import corpus_text
    from lmforge.tokenizer import train_tokenizer
    from lmforge.tokenizer.train import DEFAULT_MIN_FREQUENCY

    refuse_overwrite(args.out, ("FILES", args.files), writes=("tokenizer.json", "tokenizer_config.json"))
    if args.kind == "unigram" and args.min_frequency is not None:  # before the corpus is read or made
        raise UsageError(f"--min-frequency {args.min_frequency}: it counts the pairs BPE and WordPiece "
                         "merge; unigram merges none")
    source = [Path(f) for f in args.files] if args.files else corpus_text(args.docs, args.seed).splitlines()
    tokenizer = train_tokenizer(source, args.kind, args.vocab_size, family=args.family,
                                lowercase=args.lowercase, strip_accents=args.strip_accents,
                                min_frequency=args.min_frequency or DEFAULT_MIN_FREQUENCY)
    tokenizer.save(args.out)
    corpus = f"{len(args.files)} file(s)" if args.files else f"built-in corpus, {args.docs} documents"
    print(f"wrote {args.out} ({args.kind}, {tokenizer.vocab_size} ids, {corpus})")


def add_parsers(sub) -> None:
    """Add tokenizer train to the main parser."""
    from lmforge.tokenizer.train import DEFAULT_MIN_FREQUENCY, FAMILIES, KINDS, MAX_MIN_FREQUENCY

    group = sub.add_parser("tokenizer", help="train tokenizers").add_subparsers(dest="action", required=True)
    p = group.add_parser("train", help="train a tokenizer (tokenizer.json + tokenizer_config.json in --out)")
    p.add_argument("files", nargs="*", help="text, JSONL or .gz files, read as `corpus shard` reads them "
                   "(default: the built-in corpus)")
    p.add_argument("--kind", required=True, choices=KINDS)
    p.add_argument("--vocab-size", type=int, required=True, help="ids, special tokens included")
    p.add_argument("--family", choices=tuple(FAMILIES), help="special tokens and template (default: by kind)")
    p.add_argument("--lowercase", action="store_true")
    p.add_argument("--strip-accents", action="store_true", help="NFD, then drop combining marks")
    p.add_argument("--min-frequency", type=bounded(int, 1, MAX_MIN_FREQUENCY),
                   help=f"least count of a merged pair (BPE, WordPiece; default {DEFAULT_MIN_FREQUENCY})")
    p.add_argument("--out", required=True)
    p.add_argument("--docs", type=bounded(int, 1, 1_000_000), default=5000,
                   help="documents of the built-in corpus")
    p.add_argument("--seed", type=bounded(int, *SEED), default=0, help="seed of the built-in corpus")
    p.set_defaults(func=cmd_tokenizer_train)
