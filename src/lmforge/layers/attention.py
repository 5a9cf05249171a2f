"""Multi-head attention (Vaswani et al. 2017, sec. 3.2) with GQA/MQA, cross-attention and a KV cache.

One kernel, `attend`, serves every pattern: torch's fused scaled-dot-product
attention, or, when the caller wants to look at them, an explicit softmax that
also returns the probabilities and gives the same outputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.config import ModelConfig
from lmforge.layers.linformer import LinformerProjection
from lmforge.layers.positions import apply_rotary
from lmforge.layers.xl_relative import XLRelativeBias


def attend(q, k, v, bias=None, dropout_p: float = 0.0, scale: float = 1.0, return_probs: bool = False):
    """softmax(q k^T * scale + bias) v. q (B, H, Tq, dh); k, v (B, Hkv, Tk, dh); bias additive,
    broadcastable to (B, H, Tq, Tk). Returns (out (B, H, Tq, dh), probs or None)."""
    if k.shape[1] != q.shape[1]:  # GQA/MQA: each kv head serves n_heads / n_kv_heads query heads
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if not return_probs:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
        return out, None
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    out = torch.matmul(F.dropout(probs, dropout_p) if dropout_p else probs, v)
    return out, probs


class KVCache:
    """Keys and values of earlier positions, per layer, for incremental decoding.

    Self-attention entries grow by the new positions each step; cross-attention entries
    (the encoder's keys and values) are computed once and reused."""

    def __init__(self) -> None:
        self.self_kv: dict = {}
        self.cross_kv: dict = {}

    @property
    def length(self) -> int:
        """Number of positions already cached."""
        return self.self_kv[0][0].shape[2] if self.self_kv else 0

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple:
        """Append this step's (B, Hkv, T, dh) keys/values; return all cached ones."""
        if layer in self.self_kv:
            past_k, past_v = self.self_kv[layer]
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        self.self_kv[layer] = (k, v)
        return k, v


@dataclass
class AttentionContext:
    """What every layer of one stack's forward pass shares (built once by the stack)."""

    q_pos: torch.Tensor  # (Tq,) absolute positions of the queries
    k_pos: torch.Tensor  # (Tk,) absolute positions of the keys (cached + new)
    biases: dict = field(default_factory=dict)  # mask key -> additive (B|1, H|1, Tq, Tk) or None
    rope: Optional[tuple] = None  # (cos, sin), each (B|1, 1, Tq, r)
    key_padding: Optional[torch.Tensor] = None  # (B, Tk) True at real tokens
    global_tokens: Optional[torch.Tensor] = None  # (B, T) Longformer global positions
    segments: Optional[torch.Tensor] = None  # (B, Tk) for XLNet's segment term
    cache: Optional[KVCache] = None
    return_probs: bool = False
    cross_bias: Optional[torch.Tensor] = None  # (B, 1, 1, Tsrc) encoder padding
    memory: Optional[torch.Tensor] = None  # (B, Tsrc, d_model) encoder output


class Attention(nn.Module):
    """Self- or cross-attention with n_heads query and n_kv_heads key/value heads."""

    def __init__(self, cfg: ModelConfig, pattern: str = "full", cross: bool = False) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.dh = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.pattern, self.cross = pattern, cross
        q_dim, kv_dim = self.n_heads * self.dh, self.n_kv * self.dh
        if cross:
            self.q = nn.Linear(cfg.d_model, q_dim, bias=cfg.attention_bias)
            self.kv = nn.Linear(cfg.d_model, 2 * kv_dim, bias=cfg.attention_bias)
        else:  # fused projection: one matmul for q, k and v
            self.qkv = nn.Linear(cfg.d_model, q_dim + 2 * kv_dim, bias=cfg.attention_bias)
        self.out = nn.Linear(q_dim, cfg.d_model, bias=cfg.attention_bias)
        self.scale = 1.0 / math.sqrt(self.dh) if cfg.attention_scaling else 1.0
        self.dropout_p = cfg.attention_dropout
        own = not cross
        self.global_qkv = (nn.Linear(cfg.d_model, q_dim + 2 * kv_dim, bias=cfg.attention_bias)
                           if own and cfg.global_projections and pattern == "longformer" else None)
        self.linformer = LinformerProjection(cfg) if own and pattern == "linformer" else None
        self.xl = XLRelativeBias(cfg) if own and cfg.position == "xl-relative" else None

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:  # (B, T, n*dh) -> (B, n, T, dh)
        B, T, _ = x.shape
        return x.view(B, T, n, self.dh).transpose(1, 2)

    def _split(self, fused: torch.Tensor) -> tuple:
        q_dim, kv_dim = self.n_heads * self.dh, self.n_kv * self.dh
        q, k, v = fused.split([q_dim, kv_dim, kv_dim], dim=-1)
        return self._heads(q, self.n_heads), self._heads(k, self.n_kv), self._heads(v, self.n_kv)

    def forward(self, x: torch.Tensor, ctx: AttentionContext, layer: int, mask_key=None) -> tuple:
        """x (B, T, d_model) -> (B, T, d_model), attention probabilities or None."""
        if self.cross:
            q, k, v = self._cross_qkv(x, ctx, layer)
            bias = ctx.cross_bias
        else:
            q, k, v = self._split(self.qkv(x))
            if ctx.rope is not None:
                q, k = apply_rotary(q, *ctx.rope), apply_rotary(k, *ctx.rope)
            if ctx.cache is not None:
                k, v = ctx.cache.extend(layer, k, v)
            bias = ctx.biases.get(mask_key)
            if self.linformer is not None:
                k, v = self.linformer(k, v, ctx.key_padding)
                bias = None  # every projected key is visible
            if self.xl is not None:
                xl = self.xl(q, k, ctx.q_pos, ctx.k_pos, ctx.segments, self.scale)
                bias = xl if bias is None else bias + xl
        p = self.dropout_p if self.training else 0.0
        out, probs = attend(q, k, v, bias, p, self.scale, ctx.return_probs)
        if self.global_qkv is not None and ctx.global_tokens is not None:
            out = self._longformer_global(x, out, ctx)
        B, H, T, dh = out.shape
        return self.out(out.transpose(1, 2).reshape(B, T, H * dh)), probs

    def _cross_qkv(self, x: torch.Tensor, ctx: AttentionContext, layer: int) -> tuple:
        q = self._heads(self.q(x), self.n_heads)
        if ctx.cache is not None and layer in ctx.cache.cross_kv:
            k, v = ctx.cache.cross_kv[layer]  # the encoder output does not change while decoding
        else:
            k, v = (self._heads(t, self.n_kv) for t in self.kv(ctx.memory).chunk(2, dim=-1))
            if ctx.cache is not None:
                ctx.cache.cross_kv[layer] = (k, v)
        return q, k, v

    def _longformer_global(self, x: torch.Tensor, local: torch.Tensor, ctx: AttentionContext):
        """Longformer sec. 3.1: global rows are recomputed with their own projections over all keys."""
        q, k, v = self._split(self.global_qkv(x))
        bias = None
        if ctx.key_padding is not None:
            bias = torch.zeros(ctx.key_padding.shape, dtype=q.dtype, device=q.device)
            bias = bias.masked_fill(~ctx.key_padding, torch.finfo(q.dtype).min)[:, None, None, :]
        p = self.dropout_p if self.training else 0.0
        glob, _ = attend(q, k, v, bias, p, self.scale)
        rows = ctx.global_tokens[:, None, :, None]  # (B, 1, T, 1)
        return torch.where(rows, glob, local)
