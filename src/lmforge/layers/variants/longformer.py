"""Longformer's global attention with projections of its own (Beltagy et al. 2020, sec. 3.1).

Every token attends through the local projections Q_s, K_s, V_s to its window and to the global
tokens (the `longformer` pattern, layers/patterns.py): that is the ordinary attention path. The
global tokens' own rows are then recomputed with Q_g, K_g, V_g against every key, a (G, T)
attention rather than (T, T). The stack chooses this class for `longformer` layers of a config
with `global_projections`.
"""
from __future__ import annotations

import torch

from lmforge.config import ModelConfig
from lmforge.layers.attention import Attention, AttentionContext, attend
from lmforge.layers.inspection import eager_probabilities
from torch import nn


class LongformerGlobalAttention(Attention):
    """Attention whose global tokens' rows come from separate projections (`global_qkv`)."""

    def __init__(self, cfg: ModelConfig, pattern: str = "longformer", n_heads=None) -> None:
        super().__init__(cfg, pattern, n_heads=n_heads)
        self.global_qkv = nn.Linear(cfg.d_model, self.qkv.out_features, bias=cfg.attention_bias)

    def _attend(self, x, q, k, v, bias, ctx: AttentionContext, kernel) -> tuple:
        out, probs = super()._attend(x, q, k, v, bias, ctx, kernel)  # (B, H, T, dh): every row, locally
        if ctx.global_tokens is None:
            return out, probs
        return self._global_rows(x, out, ctx, kernel), probs

    def _global_inputs(self, x: torch.Tensor, ctx: AttentionContext, kernel) -> tuple:
        """(rows (G,), q (B, H, G, dh), k, v (B, Hkv, T, dh), padding bias (B, 1, 1, T) or None) of
        the tokens global in some row of the batch, through the global projections."""
        rows = ctx.global_rows  # (G,): the default's, known without reading the mask back
        if rows is None:
            rows = ctx.global_tokens.any(0).nonzero().squeeze(1)
        q, k, v = kernel.heads(self.global_qkv(x), self.n_heads, self.n_kv, self.dh)  # padded layout
        bias = None
        if ctx.key_padding is not None:
            bias = torch.zeros(ctx.key_padding.shape, dtype=q.dtype, device=q.device)
            bias = bias.masked_fill(~ctx.key_padding, torch.finfo(q.dtype).min)[:, None, None, :]
        return rows, q[:, :, rows], k, v, bias

    def _global_rows(self, x: torch.Tensor, local: torch.Tensor, ctx: AttentionContext,
                     kernel) -> torch.Tensor:
        """local (B, H, T, dh) with each row's global tokens recomputed over all keys."""
        if ctx.global_rows is None and not ctx.global_tokens.any():
            return local
        rows, q, k, v, bias = self._global_inputs(x, ctx, kernel)
        p = self.dropout_p if self.training else 0.0
        glob, _ = attend(q, k, v, bias, p, self.scale)  # (B, H, G, dh): G x T, not T x T
        chosen = ctx.global_tokens[:, rows][:, None, :, None]  # (B, 1, G, 1)
        return local.index_copy(2, rows, torch.where(chosen, glob, local[:, :, rows]))

    def probabilities(self, x, q, k, bias, ctx: AttentionContext, kernel) -> torch.Tensor:
        """The local probabilities with the global tokens' rows those of the global projections."""
        local = super().probabilities(x, q, k, bias, ctx, kernel)  # (B, H, T, T)
        if ctx.global_tokens is None or not ctx.global_tokens.any():
            return local
        rows, gq, gk, _, gbias = self._global_inputs(x, ctx, kernel)
        glob = eager_probabilities(gq, gk, gbias, self.scale)  # (B, H, G, T)
        chosen = ctx.global_tokens[:, rows][:, None, :, None]
        return local.index_copy(2, rows, torch.where(chosen, glob, local[:, :, rows]))
