"""`lmforge corpus shard`: text, JSONL or gzip files -> pre-tokenised shards (see lmforge.data.shards)."""
from __future__ import annotations

import time
import warnings

from lmforge.cli.common import (bounded, flag_values, from_flags, note, option_flags, text_field,
                                tokenizer_folder)
from lmforge.data.corpus import CorpusWarning
from lmforge.data.read_options import ReadOptions
from lmforge.data.shards import MAX_SHARD_MB, MAX_WORKERS, MB, MIN_SHARD_MB


def cmd_corpus_shard(args) -> None:
    """Tokenise FILES into shards under --out with --workers processes; resumes an unfinished --out."""
    from lmforge.cli.common import refuse_nested, refuse_overwrite
    from lmforge.data.shards import shard_corpus, verify

    refuse_overwrite(args.out, ("FILES", args.files), ("--tokenizer", args.tokenizer),
                     writes=("manifest.json", "tokenizer"))
    refuse_nested(args.out, ("FILES", args.files))
    refuse_nested(args.out, ("--tokenizer", args.tokenizer),
                  why="the shards and the run's copy of the tokenizer would be written into it")
    options = from_flags(lambda found: ReadOptions(**found), flag_values(args, ReadOptions))
    tokenizer_folder("--tokenizer", args.tokenizer)  # the files after the options, as Python checks them
    text_field("FILES", args.files, "give --text-field, the field that holds the text", options)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("always", CorpusWarning)  # every file's, each said (cli.main: one line each)
        manifest = shard_corpus(args.files, args.tokenizer, args.out, workers=args.workers, options=options,
                                shard_bytes=int(args.shard_mb * MB), log=note)
    seconds = time.perf_counter() - start
    size = sum(i["bytes"] for i in manifest["inputs"]) / 1e6
    totals = manifest["totals"]
    print(f"wrote {args.out}: {len(manifest['shards'])} shards, {totals['documents']} documents, "
          f"{totals['sentences']} sentences, {totals['tokens']} tokens ({manifest['dtype']}); "
          f"{size:.1f} MB in {seconds:.1f} s")
    if args.verify:
        bad = verify(args.out)
        if bad:
            raise ValueError(f"checksums differ for {', '.join(bad)}")
        print("checksums verified")


def add_parsers(sub) -> None:
    """The `corpus` sub-command and its actions."""
    group = sub.add_parser("corpus", help="corpus ingestion: pre-tokenised shards").add_subparsers(
        dest="action", required=True)
    p = group.add_parser("shard", help="tokenise text/JSONL files (gzip, bzip2, xz too) into "
                                             "memory-mappable shards")
    p.add_argument("files", nargs="+", help="text, JSONL or compressed (gzip, bzip2, xz) files, or "
                   "directories of them")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory (copied into --out)")
    p.add_argument("--out", required=True, help="the shards' directory (with a copy of the tokenizer)")
    p.add_argument("--workers", type=bounded(int, 1, MAX_WORKERS), default=1,
                   help="worker processes (the shards are the same for any)")
    option_flags(p, ReadOptions, bound=True)
    p.add_argument("--shard-mb", type=bounded(float, MIN_SHARD_MB, MAX_SHARD_MB), default=64.0,
                   help="large uncompressed files: MB of text per shard")
    p.add_argument("--verify", action="store_true", help="re-read every shard and check its checksums")
    p.set_defaults(func=cmd_corpus_shard)
