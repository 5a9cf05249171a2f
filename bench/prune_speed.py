"""Forward time of pruned models against their unpruned source, side by side in one process.

Rounds alternate between the models (A B C A B C ...) on the same batch (the library's
lmforge.utils.timing.alternating), so load from other processes hits every model alike; the
ratio of medians is reported.

    python -m bench.prune_speed SOURCE_DIR PRUNED_DIR [PRUNED_DIR ...] [--batch 16 --length 128]
"""
from __future__ import annotations

import argparse
import json

import torch

import lmforge
from bench.common import machine
from lmforge.utils.timing import alternating


def forward_medians(models: list, ids, mask, rounds: int) -> list:
    """Median seconds of one inference forward of each model, over `rounds` alternating rounds
    after a warm-up call each."""
    calls = {i: (lambda m=m: m(ids, attention_mask=mask)) for i, m in enumerate(models)}
    return list(alternating(calls, rounds=rounds).values())


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
    medians = forward_medians(models, ids, mask, args.rounds)
    print(json.dumps({"batch": args.batch, "length": args.length, "threads": torch.get_num_threads(),
                      "machine": machine(),
                      "models": [{"dir": d, "parameters": m.num_parameters(), "seconds": s,
                                  "speedup": medians[0] / s} for d, m, s in zip(args.models, models, medians)]},
                     indent=2))


if __name__ == "__main__":
    main()
