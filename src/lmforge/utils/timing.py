"""The one timing helper: rounds of calls side by side, for the measured choices of fast paths (int8
kernels, decoding projections), for comparisons of models (compress/measure.py,
analysis/head_report.py) and for the benchmarks (bench/common.py)."""
from __future__ import annotations

import functools
import os
import statistics
import time
from pathlib import Path

import torch

FALLBACK_CACHE_BYTES = 32 << 20  # a last-level cache's size where /sys does not say it
MAX_EMPTYING_BYTES = 1 << 30  # cold_caches' block at most: a CPU reporting a huge cache gets 1 GB
BUSY_SHARE = 0.25  # a measurement while more of its CPUs' time than this went to other work is "busy",
# if that is at least this many clock ticks (50 ms at 100 Hz): fewer cannot tell. Was 20: a kernel timed
# in ~0.2 s while a test run held the other core met fewer, and "onednn-u8-serial" (one thread) was kept
# for MiniLM's q, k, v at 2,048 rows (bench/FINDINGS.md). A choice judged busy wrongly is measured again by
# the next process; one kept wrongly stays for every later process
BUSY_TICKS = 5


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


def rounds_of(calls: dict, rounds: int = 5, between=None, warmup: int = 1, zigzag: bool = False,
              self_timed: bool = False) -> dict:
    """name -> seconds of calls[name]() in each of `rounds` rounds, every call once a round, so load
    from elsewhere (other work, heat) falls on all alike; after `warmup` untimed calls each (first-call
    allocations, int8 kernel measurement). between(), where given, runs before each timed call, outside
    its time (cold_caches); `zigzag` reverses the order every other round (no call always goes first);
    `self_timed`: each call returns its own seconds (timed where it runs, another process's part of it)."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    times: dict = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in (names[::-1] if zigzag and r % 2 else names):
            if between is not None:
                between()
            start = time.perf_counter()
            seconds = calls[name]()
            times[name].append(seconds if self_timed else time.perf_counter() - start)
    return times


@torch.no_grad()  # inference is timed: with autograd on, an int8 layer takes its fp32 reference path
def alternating(calls: dict, rounds: int = 5, pick=statistics.median, between=None) -> dict:
    """name -> median (or `pick`) seconds of calls[name]() over alternating rounds (rounds_of), in
    inference (no autograd)."""
    return {name: pick(t) for name, t in rounds_of(calls, rounds, between=between).items()}


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


class Elsewhere:
    """With `with Elsewhere() as other:` around a measurement, the CPU time its CPUs (this process's
    affinity) gave to other work meanwhile: other processes and, in a virtual machine, the hypervisor's
    other guests (steal). other.ticks (clock ticks), other.share (of those CPUs' time), other.busy. A
    kernel chosen while a neighbour took a CPU is chosen for that load (one thread, where two lose),
    not for the machine. Read from /proc (Linux); elsewhere nothing is seen (0)."""

    def __enter__(self) -> Elsewhere:
        self.ticks, self.share, self._start = 0, 0.0, _ticks()
        return self

    def __exit__(self, *exc) -> bool:
        end = _ticks()
        if self._start is not None and end is not None:
            (busy, own, wall, cpus), (busy_end, own_end, wall_end, _) = self._start, end
            self.ticks = max(0, (busy_end - busy) - (own_end - own))
            self.share = self.ticks / max(1.0, (wall_end - wall) * cpus)
        return False

    @property
    def busy(self) -> bool:
        """Whether other work took more than BUSY_SHARE of the CPUs, and at least BUSY_TICKS."""
        return self.share > BUSY_SHARE and self.ticks >= BUSY_TICKS


def _ticks():
    """(busy ticks of this process's CPUs, this process's own ticks, clock ticks now, CPUs), or None."""
    try:
        hz, cpus = os.sysconf("SC_CLK_TCK"), _cpus()
        busy = 0
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                name, *values = line.split()
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                    # user nice system idle iowait irq softirq steal: all but idle and iowait
                    busy += sum(int(values[i]) for i in (0, 1, 2, 5, 6, 7))
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        own = int(fields[11]) + int(fields[12])  # utime, stime: every thread of this process
        return busy, own, time.monotonic() * hz, len(cpus)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _cpus() -> set:
    """The CPUs any thread of this process may run on (OpenMP may pin its threads to one CPU each)."""
    cpus = set()
    for task in os.listdir("/proc/self/task"):
        try:
            cpus |= os.sched_getaffinity(int(task))
        except OSError:  # a thread that ended meanwhile
            continue
    return cpus or os.sched_getaffinity(0)
