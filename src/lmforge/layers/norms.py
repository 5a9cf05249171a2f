"""Normalisation layers: LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019)."""
from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ModelConfig


class RMSNorm(nn.Module):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * g, no centring and no bias (as in T5 and Llama)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # statistics in fp32 so bf16 activations do not lose the small variances
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


def _layernorm(dim: int, cfg: ModelConfig) -> nn.Module:
    return nn.LayerNorm(dim, eps=cfg.norm_eps, bias=cfg.norm_bias)


def _rmsnorm(dim: int, cfg: ModelConfig) -> nn.Module:
    return RMSNorm(dim, eps=cfg.norm_eps)


NORMS = {"layernorm": _layernorm, "rmsnorm": _rmsnorm}


def make_norm(cfg: ModelConfig, dim: int | None = None) -> nn.Module:
    """The norm that `cfg.norm` selects, over `dim` features (default d_model)."""
    return NORMS[cfg.norm](dim or cfg.d_model, cfg)
