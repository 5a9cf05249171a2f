"""Timing for the measured choices of fast paths (int8 kernels, decoding projections)."""
from __future__ import annotations

import statistics
import time


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
