"""Transformer-XL / XLNet relative attention (Dai et al. 2019 sec. 3.3; Yang et al. 2019 sec. 2.5).

score(i, j) = (q_i + u)·k_j + (q_i + v)·W_r R_{i-j} + (q_i + s)·seg[s_ij]; the first
product q·k is the ordinary attention score, so this module returns the rest as an
additive bias, already multiplied by the attention scale.
"""
from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.layers.dropout import Dropout


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
        self.r_proj = nn.Linear(cfg.d_model, H * dh, bias=False)  # W_r
        self.r_w_bias = nn.Parameter(torch.empty(H, dh))  # u
        self.r_r_bias = nn.Parameter(torch.empty(H, dh))  # v
        self.r_s_bias = nn.Parameter(torch.empty(H, dh))  # s
        self.seg_embed = nn.Parameter(torch.empty(2, H, dh))  # same / different segment
        self.dropout = Dropout(cfg.dropout)

    def forward(self, q, k, q_pos, k_pos, segments, scale: float) -> torch.Tensor:
        # q (B, H, Tq, dh), k (B, H, Tk, dh) -> bias (B, H, Tq, Tk)
        B, H, Tq, dh = q.shape
        content = torch.einsum("hd,bhjd->bhj", self.r_w_bias, k)[:, :, None, :]
        distance = q_pos[:, None] - k_pos[None, :]  # (Tq, Tk): i - j
        low = int(distance.min())
        values = torch.arange(low, int(distance.max()) + 1, device=q.device)
        r = self.r_proj(self.dropout(relative_sinusoids(values, self.d_model).to(q.dtype)))
        by_distance = torch.einsum("bhid,nhd->bhin", q + self.r_r_bias[:, None], r.view(-1, H, dh))
        index = (distance - low).expand(B, H, Tq, -1)
        position = by_distance.gather(-1, index)
        bias = content + position
        if segments is not None:  # XLNet adds the segment term only when segments are given
            by_segment = torch.einsum("bhid,shd->bhis", q + self.r_s_bias[:, None], self.seg_embed)
            differ = (segments[:, -Tq:, None] != segments[:, None, :])[:, None]  # (B, 1, Tq, Tk)
            bias = bias + torch.where(differ, by_segment[..., 1:2], by_segment[..., 0:1])
        return bias * scale
