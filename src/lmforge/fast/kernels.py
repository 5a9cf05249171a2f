"""Attention backends beside the plain one (layers/attention.py DenseKernel), with its three calls.

The model's forward chooses a backend per mask and puts it on the AttentionContext; the layers
call it without knowing which it is:

    q, k, v = kernel.heads(fused, n_heads, n_kv, dh)    # the fused projection, in the kernel's layout
    out, probs = kernel.attend(q, k, v, bias, dropout_p, scale)
    rows = kernel.merge(out)                             # the output projection's input

Each gives the results of the dense path it replaces (tests/layers/test_fastpath.py).
"""
from __future__ import annotations

import torch

from lmforge.fast.blocked import blocked_attend
from lmforge.fast.dropout import dropout
from lmforge.fast.native_attention import attend_rows, supports
from lmforge.fast.packing import Packing
from lmforge.layers.attention import DenseKernel, attend


class DroppingKernel(DenseKernel):
    """The dense kernel for training with attention dropout on CPU: SDPA goes to its math path there
    anyway, so the same steps run here, the mask drawn by fast/dropout.py (~4x cheaper to draw)."""

    def attend(self, q, k, v, bias, dropout_p: float, scale: float) -> tuple:
        """(out (B, H, T, dh), None), as DenseKernel's."""
        if q.device.type != "cpu":
            return super().attend(q, k, v, bias, dropout_p, scale)
        return attend(q, k, v, bias, dropout_p, scale, drop=dropout)


DROPPING = DroppingKernel()  # stateless, as layers.attention.DENSE


class BlockedKernel(DenseKernel):
    """Windowed patterns in query chunks against their key bands (fast/blocked.py): the mask's
    bias is the pass's ChunkPlan, the layout the padded one."""

    def attend(self, q, k, v, plan, dropout_p: float, scale: float) -> tuple:
        """(out (B, H, T, dh), None): blocked attention returns no probabilities."""
        return blocked_attend(q, k, v, plan, dropout_p, scale), None


BLOCKED = BlockedKernel()  # stateless, as layers.attention.DENSE


class Repadded:
    """Packed rows (N, ...) of an unpadded batch (fast/packing.py) re-padded for attention: each
    sequence sees only itself through the padded path's key-padding mask."""

    def __init__(self, packing: Packing, inner) -> None:
        self.packing, self.inner = packing, inner  # inner: the kernel of the padded layout

    def heads(self, fused: torch.Tensor, n_heads: int, n_kv: int, dh: int) -> tuple:
        """(N, (H + 2 Hkv) dh) -> q (B, H, T, dh), k and v (B, Hkv, T, dh), zeros at padding."""
        return self.inner.heads(self.packing.unpack(fused), n_heads, n_kv, dh)

    def attend(self, q, k, v, bias, dropout_p: float, scale: float) -> tuple:
        """The inner kernel's attention on the padded layout."""
        return self.inner.attend(q, k, v, bias, dropout_p, scale)

    def merge(self, out: torch.Tensor) -> torch.Tensor:
        """(B, H, T, dh) -> (N, H dh), the real rows only."""
        return self.packing.pack_heads(out)


class PerSequence:
    """Packed rows attended sequence by sequence, with no re-padding and no mask: for masks of
    padding (and causality) only, where each sequence seeing itself is the whole mask."""

    def __init__(self, packing: Packing, causal: bool) -> None:
        self.packing, self.causal = packing, causal

    def heads(self, fused: torch.Tensor, n_heads: int, n_kv: int, dh: int) -> tuple:
        """(N, (H + 2 Hkv) dh) -> q (N, H, dh), k and v (N, Hkv, dh), as views."""
        q, k, v = fused.split([n_heads * dh, n_kv * dh, n_kv * dh], dim=-1)
        return q.unflatten(-1, (n_heads, dh)), k.unflatten(-1, (n_kv, dh)), v.unflatten(-1, (n_kv, dh))

    def attend(self, q, k, v, bias, dropout_p: float, scale: float) -> tuple:
        """(out (N, H, dh), None); `bias`, the padded path's mask, is what the sequences' separation does."""
        return self.packing.attend(q, k, v, self.causal, dropout_p, scale), None

    def merge(self, out: torch.Tensor) -> torch.Tensor:
        """(N, H, dh) -> (N, H dh)."""
        return out.flatten(1)


class Jagged(PerSequence):
    """Packed rows of a bidirectional mask of padding only attended in one nested jagged SDPA call
    (Packing.attend_jagged): variable-length attention, no re-padding, no mask."""

    def __init__(self, packing: Packing) -> None:
        super().__init__(packing, causal=False)

    def attend(self, q, k, v, bias, dropout_p: float, scale: float) -> tuple:
        """(out (N, H, dh), None), as PerSequence's."""
        return self.packing.attend_jagged(q, k, v, dropout_p, scale), None


class NativeRows(PerSequence):
    """Packed rows of a bidirectional mask of padding only attended in one call of the native kernel
    (fast/native_attention.py): every sequence and head in one parallel region, no re-padding, no mask."""

    def __init__(self, packing: Packing) -> None:
        super().__init__(packing, causal=False)

    def attend(self, q, k, v, bias, dropout_p: float, scale: float) -> tuple:
        """(out (N, H, dh), None), as PerSequence's, which runs what the kernel cannot (a gradient, dropout,
        autocast's half-precision heads)."""
        if not _native(q, dropout_p):
            return super().attend(q, k, v, bias, dropout_p, scale)
        return attend_rows(q, k, v, *self.packing.spans(), scale), None


class NativePadded(DenseKernel):
    """The padded layout's bidirectional attention with no mask or a key-padding bias, in one call of
    the native kernel; any other bias, dropout or gradient goes to the dense kernel."""

    def attend(self, q, k, v, bias, dropout_p: float, scale: float) -> tuple:
        """(out (B, H, T, dh) as a view of (B, T, H, dh) rows, which `merge` reads without a copy, None)."""
        B, H, T, dh = q.shape
        per_key = bias is None or (bias.shape == (B, 1, 1, T) and bias.dtype == q.dtype)
        if not per_key or not _native(q, dropout_p):
            return super().attend(q, k, v, bias, dropout_p, scale)
        # a transposed mask's bias is strided
        keys = None if bias is None else bias.reshape(B, T).contiguous()
        rows = [t.transpose(1, 2).flatten(0, 1) for t in (q, k, v)]  # views of the fused projection's rows
        starts = torch.arange(0, B * T, T, dtype=torch.int64)
        out = q.new_empty(B, T, H, dh)
        attend_rows(*rows, starts, torch.full((B,), T, dtype=torch.int64), scale, keys, out.flatten(0, 1))
        return out.transpose(1, 2), None


NATIVE_PADDED = NativePadded()  # stateless, as layers.attention.DENSE


def _native(q: torch.Tensor, dropout_p: float) -> bool:
    """Whether the native kernel can run these heads now: no dropout, no gradient (it has no backward),
    a head size and dtype it has code for."""
    return not dropout_p and not torch.is_grad_enabled() and supports(q.shape[-1], q.dtype, q.device)


def packed(packing: Packing, ctx, rows=None, by_sequence: bool = False) -> tuple:
    """(default kernel, per-mask kernels) of ctx's padded backends for packed rows: re-padded, or, for the
    masks of padding (and causality) only, `rows` (NativeRows or Jagged: every sequence in one call) where
    the mask is bidirectional, and with by_sequence sequence by sequence where `rows` does not serve."""
    kernels = {key: Repadded(packing, kernel) for key, kernel in ctx.kernels.items()}
    for key, causal in ctx.padding_only.items():
        if rows is not None and not causal:  # the jagged layout has no causal path on every backend
            kernels[key] = rows(packing)
        elif by_sequence:
            kernels[key] = PerSequence(packing, causal)
    return Repadded(packing, ctx.kernel), kernels
