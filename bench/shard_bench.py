"""Sharding throughput and peak memory: `lmforge corpus shard` on ~1 GB of built-in-corpus text.

    .venv/bin/python -m bench.shard_bench --mb 1024 --workers 2 [--dir /tmp/shard_bench]

The text is 16 MB (or --mb, if smaller) of the built-in corpus, written once and repeated
to the size asked for; a WordPiece tokenizer (8000 ids) is trained on the first 16 MB.
Reports MB/s of input text and the peak resident memory of this process and of the
largest worker (resource.getrusage; a worker's peak is counted for each worker in the
total, which is an upper bound). Target: peak under 2 GB for 1 GB of text.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time
from pathlib import Path

UNIT = 16 << 20  # bytes of generated text, repeated


def make_text(path: Path, n_bytes: int, seed: int = 0) -> Path:
    """`n_bytes` of corpus text: 16 MB generated once, then repeated (whole documents)."""
    from lmforge.data.synthetic import write_corpus

    unit = write_corpus(path.with_suffix(".unit"), min(UNIT, n_bytes), seed).read_bytes()
    with open(path, "wb") as handle:
        written = 0
        while written < n_bytes:
            handle.write(unit)
            written += len(unit)
    return path.with_suffix(".unit")


def peak_mb() -> tuple:
    """(this process, the largest child) peak RSS in MB (ru_maxrss is in KB on Linux)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, child


def main() -> None:
    """Generate the text, train a tokenizer, shard, print and return the numbers as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="MB of text to shard")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shard-mb", type=float, default=64.0)
    parser.add_argument("--dir", default="/tmp/shard_bench")
    args = parser.parse_args()

    from bench.common import machine
    from lmforge.data.shards import shard_corpus
    from lmforge.tokenizer import train_tokenizer

    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    text = root / "corpus.txt"
    unit = make_text(text, args.mb << 20)
    tokenizer = train_tokenizer([unit], "wordpiece", 8000)
    before = peak_mb()
    start = time.perf_counter()
    manifest = shard_corpus([text], tokenizer, root / "shards", workers=args.workers,
                            shard_bytes=int(args.shard_mb * (1 << 20)), log=lambda m: None)
    seconds = time.perf_counter() - start
    own, child = peak_mb()
    size = text.stat().st_size / 1e6
    result = {"text_mb": round(size, 1), "workers": args.workers, "shards": len(manifest["shards"]),
              "tokens": manifest["totals"]["tokens"], "dtype": manifest["dtype"], "seconds": round(seconds, 1),
              "mb_per_s": round(size / seconds, 2), "peak_rss_parent_mb": round(own, 1),
              "parent_before_sharding_mb": round(before[0], 1), "peak_rss_largest_worker_mb": round(child, 1),
              "peak_total_upper_bound_mb": round(own + args.workers * child, 1)}
    print(json.dumps({**result, "machine": machine()}, indent=1))
    shutil.rmtree(root, ignore_errors=True)
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
