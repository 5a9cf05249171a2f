"""An int8 feed-forward layer's hidden units made and quantised in one pass (the accelerated FFN's
route, fast/optimize.py).

Where both projections of a plain (not gated) ReLU or GELU FFN are dynamic Int8Linears, the hidden
units act(W1 x + b1) exist only to be quantised again for W2. Unfused, the (rows, d_ff) fp32 tensor is
written by the up product's row scaling, read and written by the activation, read by the down
product's quantisation. Fused (quant/csrc/rowquant.c's act_quantise_rows), each row of the up product
("onednn-u8", or "u8-vnni" where the layer chose it) is scaled, biased, activated and quantised in
cache for the down product (the same): all-MiniLM-L6-v2's 4096 x 1536 hidden units 9.4 -> 5.5 ms on an
AVX2 EPYC (bench/FINDINGS.md).

Which route runs is measured like a kernel (quant/int8.py): the first call of each (activation, d_model,
d_ff, rows bucket, threads) times the fused route against the plain one (each layer on its own
chosen kernel) and keeps the faster, written down for this machine (quant/kernel_store.py). Not at
decoding's few rows (int8.COLD), where the hidden units are a few KB. The fused bytes are the
unfused route's but where the fused GELU (within 2e-7 |v| of the exact one) falls on the other side of
a rounding boundary: one step, a few values in millions.
"""
from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from lmforge.quant import engines, int8, kernel_store, native
from lmforge.quant.engines import U8, VNNI
from lmforge.quant.int8 import COLD, Int8Linear, agrees, bucket_of
from lmforge.quant.isa import activation_bits
from lmforge.utils.hooks import hooked

FUSED = {F.relu: "relu", F.gelu: "gelu"}  # the activations act_quantise_rows computes (native.ACTIVATIONS)
ROUTES = ("fused", "plain")
ROUTE_KERNELS = (U8, VNNI)  # the products the fused route may run on (fused, _kind)
CHOICES: dict = {}  # ("ffn-" act, d_model, d_ff, bucket, threads) -> route, for this process
TIMINGS: dict = {}  # same key -> {route: fastest seconds}
_MEASURING = threading.Lock()  # taken before int8's own (the plain route makes the layers' choices)


def _applies(ffn, x: torch.Tensor) -> bool:
    """Whether the fused route may run: a plain FFN of FUSED activation between two dynamic Int8Linears
    (with no hooks, global or the layers' own: an analysis hooking a layer sees its plain call), in CPU
    fp32 inference, where the native kernel runs."""
    up, down = ffn.up, ffn.down
    if ffn.gate is not None or ffn.act not in FUSED or not isinstance(up, Int8Linear) \
            or not isinstance(down, Int8Linear) or up.mode != "dynamic" or down.mode != "dynamic":
        return False
    if hooked(up, down):  # what hooks see runs: plain
        return False
    if x.device.type != "cpu" or x.dtype != torch.float32 or torch.is_grad_enabled() and x.requires_grad:
        return False
    return engines.usable(U8)


def fused_feedforward(ffn, x: torch.Tensor) -> torch.Tensor | None:
    """W2 act(W1 x + b1) + b2 (..., d_model) through the fused route where it applies and was measured
    faster here, else None (the caller runs its plain route). The first call of a key makes the choice
    and then runs the chosen route too."""
    if not _applies(ffn, x):
        return None
    rows = x.reshape(-1, ffn.up.in_features)
    key = (f"ffn-{FUSED[ffn.act]}", ffn.up.in_features, ffn.up.out_features, bucket_of(rows.shape[0]),
           torch.get_num_threads())
    if key[3] in COLD:
        return None
    route = kernel_store.chosen(CHOICES, _MEASURING, key, lambda: _choose(ffn, key, rows))
    return fused(ffn, rows).view(*x.shape[:-1], ffn.down.out_features) if route == "fused" else None


def fused(ffn, rows: torch.Tensor) -> torch.Tensor:
    """(rows, d_model) fp32 -> (rows, d_model): the fused route, each product on "u8-vnni" where its layer
    chose that kernel for these rows, else on "onednn-u8" (both read bytes quantised per row)."""
    up, down, bits = ffn.up, ffn.down, activation_bits()
    # (rows, d_ff) of rows / peak and (rows, 1) peak, then the hidden units' bytes, on each layer's kernel
    acc, peak = up.form(_kind(up, rows.shape[0])).product(rows, bits)
    weight, levels = down.form(_kind(down, rows.shape[0])), engines.levels(bits)
    q, peak = native.act_quantise_rows(acc, peak, up.bias, FUSED[ffn.act], weight.inverse_smooth, levels,
                                       levels + 1)
    return down.rows_back(weight.multiply(q, bits), peak)


def _kind(layer: Int8Linear, rows: int) -> str:
    """The row-quantised kernel the fused route runs `layer` on for `rows` rows: "u8-vnni" where the layer
    chose it (measured as the faster at a text's few rows), else "onednn-u8"."""
    chosen = int8.CHOICES.get(layer.key(rows), "")
    return VNNI if chosen.removesuffix(int8.SERIAL) == VNNI else U8


def _choose(ffn, key: tuple, rows: torch.Tensor) -> str:
    """The route written down for `key` on this machine, else the faster of the two measured on rows
    now, written down. Where the fused output does not agree with the plain one's (or these rows give
    nothing to judge by: non-finite), the plain route runs, for this process only, whatever was written."""
    stored = (*key, "+".join((*ROUTES, *ROUTE_KERNELS)))  # routes chosen before u8-vnni: measured again
    known = kernel_store.recall(stored)
    if known == "plain":
        return known

    def plain():
        return ffn.down(ffn.hidden(rows))  # each layer on its chosen kernel

    reference = plain()  # first: the layers' kernel choices, which the fused route follows (_kind)
    if not agrees(fused(ffn, rows), reference):  # a written "fused" too: a route is kept for its speed only
        _release(ffn, rows.shape[0])
        return "plain"
    if known == "fused":
        return known
    calls = {"plain": plain, "fused": lambda: fused(ffn, rows)}
    route, TIMINGS[key] = kernel_store.settle_fastest(stored, calls, rounds=5, stale=known)
    if route == "plain":
        _release(ffn, rows.shape[0])
    return route


def _release(ffn, rows: int) -> None:
    """Drop the layers' "onednn-u8" forms packed for the fused route where they run another kernel: an
    idle copy of the weights is not kept (as int8's own measurement drops its losers')."""
    for layer in (ffn.up, ffn.down):
        if int8.CHOICES.get(layer.key(rows), "").removesuffix(int8.SERIAL) != U8:
            layer.release(U8)


def routes() -> list:
    """What each (activation, d_model, d_ff, rows, threads) met runs: its times ("ms"), or the file the
    route was read from."""
    return kernel_store.report(CHOICES, TIMINGS, ("ffn", "d_model", "d_ff", "rows", "threads"), "route")
