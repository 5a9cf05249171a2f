"""One Transformer layer: self-attention, optional cross-attention, feed-forward.

Post-norm (Vaswani et al. 2017; BERT): x = Norm(x + Sublayer(x)).
Pre-norm (GPT-2 onwards; Xiong et al. 2020): x = x + Sublayer(Norm(x)).
"""
from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.layers.attention import Attention, AttentionContext
from lmforge.layers.feedforward import FeedForward
from lmforge.layers.norms import make_norm
from lmforge.layers.variants.longformer import LongformerGlobalAttention


class Block(nn.Module):
    """A layer of the one block stack that encoders, decoders and encoder-decoders share."""

    def __init__(self, cfg: ModelConfig, pattern: str = "full", cross: bool = False,
                 heads: tuple = (None, None), d_ff: int | None = None) -> None:
        """heads: (self-attention, cross-attention) head counts of a pruned layer (None: cfg.n_heads);
        d_ff: its feed-forward width after FFN pruning (None: cfg.d_ff)."""
        super().__init__()
        self.pre_norm = cfg.norm_placement == "pre"
        # Longformer's global projections are new mathematics: a class of its own, chosen by the pattern
        global_rows = pattern == "longformer" and cfg.global_projections
        self.attn = (LongformerGlobalAttention if global_rows else Attention)(cfg, pattern, n_heads=heads[0])
        self.attn_norm = make_norm(cfg)
        self.cross_attn = Attention(cfg, cross=True, n_heads=heads[1]) if cross else None
        self.cross_norm = make_norm(cfg) if cross else None
        self.ffn = FeedForward(cfg, d_ff)
        self.ffn_norm = make_norm(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def _residual(self, x: torch.Tensor, norm: nn.Module, sublayer) -> tuple:
        if self.pre_norm:
            h, extra = sublayer(norm(x))
            return self._add(x, h), extra
        h, extra = sublayer(x)
        return norm(self._add(x, h)), extra

    def _add(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The residual sum x + dropout(h)."""
        return x + self.dropout(h)

    def forward(self, x: torch.Tensor, ctx: AttentionContext, layer: int, mask_key=None,
                self_attention=None) -> tuple:
        """x (B, T, d_model) -> (B, T, d_model), (self-attention probs, cross-attention probs);
        self_attention replaces the self-attention sublayer (XLNet's query stream, two_stream.py)."""
        attention = self_attention or (lambda h: self.attn(h, ctx, layer, mask_key))
        x, probs = self._residual(x, self.attn_norm, attention)
        cross_probs = None
        if self.cross_attn is not None:
            x, cross_probs = self._residual(x, self.cross_norm, lambda h: self.cross_attn(h, ctx, layer))
        x, _ = self._residual(x, self.ffn_norm, lambda h: (self.ffn(h), None))
        return x, (probs, cross_probs)
