"""Unpadding: the real tokens of a padded batch packed into one (N, d) matrix.

Every position-wise layer (projections, feed-forward, norms) then costs N rows instead
of B x T; with lengths uniform in 8..128 padded to 128 that is about half. Attention is
the one layer that needs sequences: its kernel (fast/kernels.py Repadded) re-pads q, k, v
to (B, T) and uses the padded path's key-padding mask, so every sequence attends to itself
only, exactly as padded. With by_sequence, where that mask is the only restriction (full
attention, no position terms), `attend` skips the re-padding (fast/kernels.py PerSequence):
one attention call per sequence on its slice of the packed rows (block-diagonal attention:
sum of L_i^2 scores instead of B T^2, no mask, but B calls per layer).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class Packing:
    """Where the real tokens of a (B, T) batch are, and the moves between layouts."""

    def __init__(self, mask: torch.Tensor, by_sequence: bool = True) -> None:
        self.shape = tuple(mask.shape)  # (B, T)
        self.by_sequence = by_sequence  # masks of padding only may use `attend` instead of re-padding
        self.jagged = False  # ... and, bidirectional, `attend_jagged` (one call) whatever by_sequence says
        self._offsets = None  # the sequences' starts in the packed rows, for attend_jagged
        self._spans = None  # (starts, lengths) int64, for the native kernel (fast/kernels.py NativeRows)
        self.index = mask.reshape(-1).nonzero().squeeze(1)  # (N,) flat positions of real tokens
        # each row's real tokens, contiguous once packed
        self.lengths = [int(n) for n in mask.sum(1).tolist()]

    @property
    def n_tokens(self) -> int:
        """N, the number of real tokens."""
        return self.index.numel()

    def spans(self) -> tuple:
        """(starts, lengths): each sequence's first row in the packed rows and its length, int64 (B,)."""
        if self._spans is None:  # once a pass, not once a layer
            lengths = torch.tensor(self.lengths, dtype=torch.int64)
            self._spans = (lengths.cumsum(0) - lengths, lengths)
        return self._spans

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...) real positions only."""
        return x.flatten(0, 1).index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...) with zeros at padded positions."""
        out = x.new_zeros((self.shape[0] * self.shape[1],) + tuple(x.shape[1:]))
        return out.index_copy_(0, self.index, x).unflatten(0, self.shape)  # in place: no second copy

    def pack_heads(self, out: torch.Tensor) -> torch.Tensor:
        """Attention output (B, H, T, dh) -> (N, H * dh) real rows (index_select: its backward is
        deterministic, unlike advanced indexing's accumulating scatter)."""
        B, H, T, dh = out.shape
        return out.transpose(1, 2).reshape(B * T, H * dh).index_select(0, self.index)

    def attend_jagged(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                      scale: float = 1.0) -> torch.Tensor:
        """`attend` without causality in one call: q (N, H, dh), k, v (N, Hkv, dh) viewed as nested
        jagged (B, H, j, dh) tensors over the sequences' offsets -> (N, H, dh). CUDA runs it with the
        flash or memory-efficient variable-length kernels; the CPU with SDPA's math path."""
        if k.shape[1] != q.shape[1]:  # GQA/MQA
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if self._offsets is None or self._offsets.device != q.device:  # once a pass, not once a layer
            self._offsets = torch.tensor([0, *self.lengths], device=q.device).cumsum(0)
        offsets = self._offsets
        # contiguous rows: the split views of the fused projection are strided, which only some
        # backends accept (SDPA's math path on nested tensors does not)
        jagged = [torch.nested.nested_tensor_from_jagged(t.contiguous(), offsets,
                                                         min_seqlen=min(self.lengths),
                                                         max_seqlen=max(self.lengths)).transpose(1, 2)
                  for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*jagged, dropout_p=dropout_p, scale=scale)
        return out.transpose(1, 2).values()

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
               dropout_p: float = 0.0, scale: float = 1.0) -> torch.Tensor:
        """Each sequence's queries against its own keys: q (N, H, dh), k, v (N, Hkv, dh) -> (N, H, dh).
        causal: a query sees the real tokens up to itself, as the padded causal mask lets it."""
        if k.shape[1] != q.shape[1]:  # GQA/MQA
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        # (1, H, N, dh) views split once into each sequence's (1, H, L, dh): one call per tensor instead
        # of a slice, transpose and unsqueeze per sequence (bert-mini, 32 sequences: 3.7 vs 4.2 ms a layer)
        qs, ks, vs = (t.transpose(0, 1)[None].split(self.lengths, dim=2) for t in (q, k, v))
        parts = [F.scaled_dot_product_attention(*one, dropout_p=dropout_p, is_causal=causal, scale=scale)
                 for *one, length in zip(qs, ks, vs, self.lengths) if length]
        if torch.is_grad_enabled():  # cat with out= has no backward
            return torch.cat(parts, dim=2)[0].transpose(0, 1)
        out = q.new_empty(q.shape)
        torch.cat(parts, dim=2, out=out.transpose(0, 1)[None])  # written straight into (N, H, dh) rows
        return out
