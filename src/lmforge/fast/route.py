"""Where a large fp32 output that dies inside its layer is written: oneDNN's fresh tensor, or the
layer's reused scratch buffer by MKL's sgemm, as measured on this machine (fast/linear.py asks).

glibc maps every block of 32 MiB and more afresh (its mmap threshold rises with frees but stops
there), so such an output is page-faulted at every call; oneDNN's linear cannot write into a given
buffer, MKL's product can. Which costs less depends on the CPU: on two threads of an AVX-512 Xeon,
bert-base's 32 x 128 FFN hidden units (48 MiB) took 57.9 ms by oneDNN into fresh pages and 48.3 ms by
MKL into the reused buffer, and a bert-base forward 2.11 -> 1.90 s; on a Zen 5 EPYC MKL's sgemm runs
at ~195 GFLOP/s against oneDNN's ~440, and the fresh pages cost less than that (bench/FINDINGS.md,
"Fresh outputs on a Xeon"). So each (in, out, rows bucket, threads, activation, packing) is timed the
first time it is met, each route with all it does (the activation inside oneDNN's call, or in place on the
buffer after MKL's), and the choice written down beside the int8 kernels' (quant/kernel_store.py): the
two round apart (within float rounding), and a model gives the same outputs in every process on one
machine.
"""
from __future__ import annotations

import threading

import torch

from lmforge.quant import kernel_store
from lmforge.quant.scratch import SCRATCH_MIN_BYTES

FRESH_MAP_BYTES = 32 << 20  # glibc's largest mmap threshold on 64-bit: blocks this large are mapped afresh
ROUTES = ("onednn", "scratch")
KIND = "fp32-output"  # the first part of a choice's key, beside int8's modes in the store
CHOICES: dict = {}  # (KIND, in, out, rows bucket, threads, activation, packed) -> route, for this process
TIMINGS: dict = {}  # same key -> {route: fastest seconds}, what the choice was made on
_MEASURING = threading.Lock()  # one measurement at a time (a server's workers meeting a new shape)


def mapped_afresh(x: torch.Tensor, out_features: int) -> bool:
    """Whether an (rows of x, out_features) output is one glibc maps afresh at every call, and one a
    scratch buffer takes (none under a pooling allocator, which reuses freed blocks itself)."""
    rows = x.numel() // max(x.shape[-1], 1)
    return rows * out_features * x.element_size() >= max(FRESH_MAP_BYTES, SCRATCH_MIN_BYTES)


def key_of(x: torch.Tensor, out_features: int, how: tuple = ()) -> tuple:
    """(KIND, in, out, rows rounded up to a power of two, threads, *how): what a route is chosen for; how:
    what else changes the two calls' costs (the activation after the product, a packed weight)."""
    rows = max(x.numel() // max(x.shape[-1], 1), 1)
    return KIND, x.shape[-1], out_features, 1 << (rows - 1).bit_length(), torch.get_num_threads(), *how


def route(x: torch.Tensor, out_features: int, calls: dict, how: tuple = ()) -> str:
    """The route ("onednn" or "scratch") for x: recalled, or timed now on calls (route -> a call on x,
    each doing all the route would do: the activation too)."""
    key = key_of(x, out_features, how)
    return kernel_store.chosen(CHOICES, _MEASURING, key, lambda: _choose(key, calls))


def _choose(key: tuple, calls: dict) -> str:
    """The route written down for `key` on this machine, else the faster of calls' measured now, written
    down (kernel_store.settle_fastest)."""
    stored = (*key, "+".join(ROUTES))
    known = kernel_store.recall(stored)
    if known in ROUTES:
        return known
    # an entry naming no route (a hand edit, a later lmforge's) is replaced, not kept and run as oneDNN's
    chosen, TIMINGS[key] = kernel_store.settle_fastest(stored, calls, rounds=3, stale=known)
    return chosen


def choices() -> list:
    """This process's routes with the times they were chosen on ("ms"), or the file they were read from."""
    fields = ("kind", "in", "out", "rows", "threads", "activation", "packed")
    return kernel_store.report(CHOICES, TIMINGS, fields, "route")
