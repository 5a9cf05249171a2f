"""The optimized forward (given to a model by `lmforge.optimize`): the same results within float
rounding, less work.

- unpadding: the batch's real tokens packed for every position-wise layer (fast/packing.py), with
  attention re-padded per layer or run sequence by sequence (fast/kernels.py);
- windowed patterns of long sequences in query chunks against their key band (fast/blocked.py);
- attention dropout's mask drawn the cheaper way (fast/dropout.py).
Which of them runs is decided per call from the model's `FastPaths` (fast/paths.py).
No packing where a forward hook watches a layer (it would see packed rows, not the plain (B, T, ...)
layout) or a row is padding only (the plain forward computes its states, which a decoder reads).
"""
from __future__ import annotations

import torch

from lmforge.fast.blocked import blocked_layers, plans
from lmforge.fast.kernels import BLOCKED, DROPPING, NATIVE_PADDED, Jagged, NativeRows, packed
from lmforge.fast.native_attention import MAX_LENGTH, supports
from lmforge.fast.packing import Packing
from lmforge.fast.paths import FastPaths
from lmforge.layers.attention import DENSE
from lmforge.layers.execution import Execution
from lmforge.utils.hooks import hooked

# below this many query rows x heads a pass (B T H) attends by SDPA, whose call costs ~30 us less than the
# native kernel's: SDPA 10 vs 43 us at bert-tiny's (1, 2, 16, 64); the native kernel wins from (4, 12, 16,
# 32) on: 53 vs 111 us (two threads of an AVX-512 EPYC, bench/FINDINGS.md)
NATIVE_MIN_QUERIES = 512


def hooked_inside(model) -> bool:
    """Whether a forward hook or pre-hook (global, or on a layer inside `model`) would see a layer's
    inputs or outputs; a model's own hooks (its input check, a generator's inside ELECTRA) see the
    padded batch either way."""
    return hooked(*(m for m in model.modules() if "execution" not in m.__dict__))


class FastExecution(Execution):
    """The plain forward's results by a cheaper route, as `paths` chooses."""

    name = "fast"

    def __init__(self, paths: FastPaths | None = None) -> None:
        self.paths = paths or FastPaths()

    def packing(self, model, key_padding, cache, memory, keep_padding: bool, reads_first: bool = False):
        """Packed real tokens when `paths` asks for them; not while decoding with a cache or
        cross-attending, whose layers need the padded layout. keep_padding: a per-token head will
        read padded rows, which must then be the padded path's; reads_first: a pooled head will read
        position 0, which must be too where a row starts with padding."""
        if cache is not None or memory is not None or not self.paths.wants_unpad(key_padding, keep_padding,
                                                                                 model.training):
            return None
        if hooked_inside(model):  # hooks see the padded (B, T, ...) layout a plain forward gives them
            return None
        if reads_first and not bool(key_padding[:, 0].all()):  # packing would leave that position zeros
            return None
        # attention dropout sends CPU SDPA to its math path: one re-padded call then beats B small
        # ones with their masks and backward (MiniLM fine-tuning: 6.0 s vs 7.1 s per 12 steps)
        dropping = model.training and model.config.attention_dropout > 0
        packing = Packing(key_padding)
        if 0 in packing.lengths:  # a row of padding only: the plain forward computes its rows (a decoder
            return None  # cross-attends to them, a pooled head reads them), packing would leave zeros
        long_enough = model.training or max(packing.lengths, default=0) >= self.paths.sequence_min_length
        packing.by_sequence = self.paths.sequence_attention and not dropping and long_enough
        # one call a layer with no empty row: nothing of the CPU loop's costs above
        packing.jagged = self.paths.wants_jagged(key_padding.device) and min(packing.lengths) > 0
        return packing

    def local_layers(self, stack, length: int) -> dict:
        """The windowed masks that pay to run in query chunks at this length (fast/blocked.py); none in
        a compiled graph, whose chunk plans (global rows, key bands) would follow the data."""
        if torch.compiler.is_compiling():
            return {}
        return blocked_layers(stack, self.paths, length)

    def choose_kernels(self, model, stack, ctx, chosen: dict, packing, recording: bool, x) -> None:
        """Chunk plans for the blocked masks, the cheaper dropout mask, and packed rows' backends."""
        ctx.biases.update(plans(stack, ctx, chosen, x.dtype, self.paths.chunk))
        ctx.kernel = DROPPING if self.paths.accelerate else DENSE
        ctx.kernels = {key: BLOCKED for key in chosen}
        native = not recording and self.wants_native(model, ctx.k_pos, x)
        if packing is not None:  # layers see (N, d_model) rows; rotations and records need (B, T)
            alone = ctx.rope is None and not recording
            rows = (NativeRows if native else Jagged if packing.jagged else None) if alone else None
            ctx.kernel, ctx.kernels = packed(packing, ctx, rows, packing.by_sequence and alone)
        elif native:
            ctx.kernels.update({key: NATIVE_PADDED for key, causal in ctx.padding_only.items() if not causal})

    def wants_native(self, model, k_pos: torch.Tensor, x: torch.Tensor) -> bool:
        """Whether bidirectional masks of padding only run the native kernel (fast/native_attention.py) for
        the stack's input x (B, T, d_model): where `paths` allows it, in inference (no gradient, no
        attention dropout, no autocast), eager (not compiling or tracing: a graph would not see the C
        call), on fp32 CPU heads it has code for, up to its length, and (paths.small_calls_plain) for at
        least NATIVE_MIN_QUERIES query rows x heads. Decided here once a pass: the kernels' own per-call
        fallback is packed-layout SDPA sequence by sequence, whatever `paths` chose."""
        tracing = torch.compiler.is_compiling() or torch.jit.is_tracing()
        dropping = model.training and model.config.attention_dropout > 0
        if not self.paths.native_attention or torch.is_grad_enabled() or tracing or dropping:
            return False
        queries = x.shape[0] * x.shape[1] * model.config.n_heads
        small = self.paths.small_calls_plain and queries < NATIVE_MIN_QUERIES
        return (not small and not torch.is_autocast_enabled(k_pos.device.type) and k_pos.numel() <= MAX_LENGTH
                and supports(model.config.head_dim, x.dtype, k_pos.device))
