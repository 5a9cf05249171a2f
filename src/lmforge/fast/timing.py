"""Timing for the measured choices of fast paths (int8 kernels, decoding projections) and for
side-by-side comparisons of models (compress/measure.py, analysis/head_report.py)."""
from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path

import torch

FALLBACK_CACHE_BYTES = 32 << 20  # a last-level cache's size where /sys does not say it
MAX_EMPTYING_BYTES = 1 << 30  # cold_caches' block at most: a CPU reporting a huge cache gets 1 GB


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
def alternating(calls: dict, rounds: int = 5, pick=statistics.median, between=None) -> dict:
    """name -> median (or `pick`) seconds of calls[name](), the calls alternating round by round (after
    a warm-up call each: first-call allocations and int8 kernel measurement); between(), where given,
    runs before each timed call, outside its time (cold_caches)."""
    for call in calls.values():
        call()
    times: dict = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            if between is not None:
                between()
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: pick(t) for name, t in times.items()}


@functools.cache
def last_level_cache_bytes() -> int:
    """The largest CPU cache's size as Linux reports it for cpu0 (FALLBACK_CACHE_BYTES where it does not)."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip().upper()
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes, default=FALLBACK_CACHE_BYTES)


def cold_caches():
    """A callable that reads twice the last-level cache's bytes: what a call timed after it finds in
    cache is what a decoding step finds of a layer's weights after every other layer has run."""
    block = torch.ones(min(2 * last_level_cache_bytes(), MAX_EMPTYING_BYTES) // 4)
    return lambda: float(block.amax())
