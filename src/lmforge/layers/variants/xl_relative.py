"""Transformer-XL / XLNet relative attention (Dai et al. 2019 sec. 3.3; Yang et al. 2019 sec. 2.5).

score(i, j) = (q_i + u)·k_j + (q_i + v)·W_r R_{i-j} + (q_i + s)·seg[s_ij]. As a position step
of attention (layers/attention.py, like rotary's rotation) this module shifts the queries by u,
so the kernel's own product gives the first term, as the reference computes it, and returns the
other two as an additive bias, already multiplied by the attention scale.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from lmforge.config import ModelConfig


def relative_sinusoids(distances: torch.Tensor, dim: int) -> torch.Tensor:
    """[sin | cos] embedding of each relative distance (XLNet's layout); (N,) -> (N, dim)."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float32, device=distances.device) / dim)
    angles = distances.float()[:, None] * inv_freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class XLRelativeBias(nn.Module):
    """Per-layer content (u), position (v, W_r) and segment (s, seg) terms of XLNet attention."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        H, dh = cfg.n_heads, cfg.head_dim
        self.d_model = cfg.d_model
        self.scale = 1.0 / math.sqrt(dh) if cfg.attention_scaling else 1.0  # the attention's own
        self.r_proj = nn.Linear(cfg.d_model, H * dh, bias=False)  # W_r
        self.r_w_bias = nn.Parameter(torch.empty(H, dh))  # u
        self.r_r_bias = nn.Parameter(torch.empty(H, dh))  # v
        self.r_s_bias = nn.Parameter(torch.empty(H, dh))  # s
        self.seg_embed = nn.Parameter(torch.empty(2, H, dh))  # same / different segment
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, q: torch.Tensor, k: torch.Tensor, ctx) -> tuple:
        """q (B, H, Tq, dh), k (B, H, Tk, dh) -> (q + u, k, bias (B, H, Tq, Tk)); ctx gives the
        positions q_pos (Tq,), k_pos (Tk,) and XLNet's segment ids (B, Tk) or None."""
        bias = self.position_term(q, ctx.q_pos, ctx.k_pos)
        if ctx.segments is not None:  # XLNet adds the segment term only when segments are given
            bias = bias + self.segment_term(q, ctx.segments)
        return q + self.r_w_bias[:, None], k, bias * self.scale

    def position_term(self, q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(q_i + v)·W_r R_{i-j}: (B, H, Tq, Tk), from one projection per distinct distance."""
        B, H, Tq, dh = q.shape
        distance = q_pos[:, None] - k_pos[None, :]  # (Tq, Tk): i - j
        if torch.compiler.is_compiling():
            # the stack's positions are q = past..past+Tq-1 over keys 0..Tk-1: the distances' range
            # follows from the shapes, so the graph reads nothing back
            low, high = 1 - q_pos.shape[0], k_pos.shape[0] - 1
        else:
            low, high = int(distance.min()), int(distance.max())
        values = torch.arange(low, high + 1, device=q.device)
        r = self.r_proj(self.dropout(relative_sinusoids(values, self.d_model).to(q.dtype)))
        by_distance = torch.einsum("bhid,nhd->bhin", q + self.r_r_bias[:, None], r.view(-1, H, dh))
        return by_distance.gather(-1, (distance - low).expand(B, H, Tq, -1))

    def segment_term(self, q: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
        """(q_i + s)·seg[same or different segment]: (B, H, Tq, Tk); segments (B, Tk), queries last."""
        by_segment = torch.einsum("bhid,shd->bhis", q + self.r_s_bias[:, None], self.seg_embed)
        differ = (segments[:, -q.shape[2]:, None] != segments[:, None, :])[:, None]  # (B, 1, Tq, Tk)
        return torch.where(differ, by_segment[..., 1:2], by_segment[..., 0:1])
