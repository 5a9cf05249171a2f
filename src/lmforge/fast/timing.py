"""Timing for the measured choices of fast paths (int8 kernels, decoding projections) and for
side-by-side comparisons of models (compress/measure.py, analysis/head_report.py)."""
from __future__ import annotations

import statistics
import time

import torch


def median_seconds(fn, repeats: int = 3) -> float:
    """Median wall time of `repeats` calls of fn(), after one warm-up call (allocations, packing,
    kernel selection)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()  # inference is timed: with autograd on, an int8 layer takes its fp32 reference path
def alternating(calls: dict, rounds: int = 5, pick=statistics.median) -> dict:
    """name -> median (or `pick`) seconds of calls[name](), the calls alternating round by round (after
    a warm-up call each: first-call allocations and int8 kernel measurement)."""
    for call in calls.values():
        call()
    times: dict = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: pick(t) for name, t in times.items()}
