"""`lmforge tokenizer train`: train a WordPiece, BPE, byte-level BPE or unigram tokenizer."""
from __future__ import annotations

from pathlib import Path

from lmforge.cli.common import SEED, bounded

BUILTIN_DOCS = 5000  # --docs unless given


def tokenizer_options(args):
    """The TokenizerOptions of the flags (train_with takes the same object): a bad value names its flag."""
    from lmforge.cli.common import flag_values, from_flags
    from lmforge.tokenizer.train import TokenizerOptions

    return from_flags(lambda given: TokenizerOptions(**given), flag_values(args, TokenizerOptions))


def cmd_tokenizer_train(args) -> None:
    """Train a tokenizer on text files (default: the built-in corpus) and save it under --out."""
    from lmforge.cli.common import UsageError, flag_values, from_flags, refuse_nested, refuse_overwrite
    from lmforge.data import corpus_text
    from lmforge.data.read_options import ReadOptions
    from lmforge.tokenizer.train import train_with
    from lmforge.tokenizer.wrapper import SAVED_FILES, SUMS_FILE, seal
    from lmforge.utils.atomic import replace_files

    refuse_overwrite(args.out, ("FILES", args.files), writes=(*SAVED_FILES, SUMS_FILE))
    # a folder of FILES given to `corpus shard` or `pretrain --data` would read the tokenizer's JSON as text
    refuse_nested(args.out, ("FILES", args.files))
    options = tokenizer_options(args)  # before the corpus is read or made
    drawn = [flag for flag in ("--docs", "--seed") if getattr(args, flag[2:]) is not None]
    if args.files and drawn:  # never ignored
        raise UsageError(f"{drawn[0]}: it draws the built-in corpus, and FILES are read instead; drop it")
    read = flag_values(args, ReadOptions)  # how FILES are read, as `corpus shard` reads them
    if read and not args.files:
        raise UsageError(f"--{next(iter(read)).replace('_', '-')} says how FILES are read: give FILES")
    read = from_flags(lambda found: ReadOptions(**found), read) if read else None
    docs, seed = args.docs or BUILTIN_DOCS, args.seed or 0
    source = [Path(f) for f in args.files] if args.files else corpus_text(docs, seed).splitlines()
    tokenizer = train_with(source, options, read)
    replace_files(args.out, tokenizer.save)  # both files or neither: never a new tokenizer.json alone
    # saved in a staging folder, where no model config records them: a model's config.json in --out gets
    # the new files' checksums (its old ones would refuse them as changed)
    seal(Path(args.out))
    corpus = f"{len(args.files)} file(s)" if args.files else f"built-in corpus, {docs} documents"
    print(f"wrote {args.out} ({options.kind}, {tokenizer.vocab_size} ids, {corpus})")


def add_parsers(sub) -> None:
    """Add tokenizer train to the main parser."""
    from lmforge.cli.common import option_flags, said
    from lmforge.data.read_options import ReadOptions
    from lmforge.tokenizer.train import TokenizerOptions

    group = sub.add_parser("tokenizer", help="train tokenizers").add_subparsers(dest="action", required=True)
    p = group.add_parser("train", help="train a tokenizer (tokenizer.json + tokenizer_config.json in --out)")
    p.add_argument("files", nargs="*", help="text, JSONL or compressed (gzip, bzip2, xz) files or folders of "
                   "them, read as `corpus shard` reads them (none: the built-in corpus)")
    # bound: a whole number (300.0) read as the int Python takes, and 1e18 told the bounds
    option_flags(p, TokenizerOptions, required=("kind", "vocab_size"), bound=True)
    option_flags(p, ReadOptions, bound=True)  # how FILES are read, as `corpus shard` reads them
    p.add_argument("--out", required=True, help="the tokenizer's directory")
    said(p.add_argument("--docs", type=bounded(int, 1, 1_000_000),
                        help="documents of the built-in corpus, without FILES"), BUILTIN_DOCS)
    said(p.add_argument("--seed", type=bounded(int, *SEED),
                        help="seed of the built-in corpus, without FILES"), 0)
    p.set_defaults(func=cmd_tokenizer_train)
