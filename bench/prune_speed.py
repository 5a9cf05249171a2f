"""Forward time of pruned models against their unpruned source, side by side in one process.

Rounds alternate between the models (A B C A B C ...) on the same batch, so load from other
processes hits every model alike; the ratio of medians is reported.

    python -m bench.prune_speed SOURCE_DIR PRUNED_DIR [PRUNED_DIR ...] [--batch 16 --length 128]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import lmforge


def timed(model, ids, mask) -> float:
    """Seconds of one inference forward."""
    start = time.perf_counter()
    with torch.no_grad():
        model(ids, attention_mask=mask)
    return time.perf_counter() - start


def main() -> None:
    """Alternate rounds over the models; print medians and ratios as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="the unpruned directory first, then pruned ones")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    models = [lmforge.optimize(lmforge.load(m).eval()) for m in args.models]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (args.batch, args.length), generator=g)
    mask = torch.ones_like(ids)
    for m in models:  # warm-up
        timed(m, ids, mask)
    times = [[] for _ in models]
    for _ in range(args.rounds):
        for i, m in enumerate(models):
            times[i].append(timed(m, ids, mask))
    medians = [statistics.median(t) for t in times]
    print(json.dumps({"batch": args.batch, "length": args.length, "threads": torch.get_num_threads(),
                      "models": [{"dir": d, "parameters": m.num_parameters(), "seconds": s,
                                  "speedup": medians[0] / s} for d, m, s in zip(args.models, models, medians)]},
                     indent=2))


if __name__ == "__main__":
    main()
