"""Position-wise feed-forward networks: plain (Vaswani et al. 2017) and gated (Shazeer 2020)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.config import ModelConfig


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation (Hendrycks & Gimpel 2016), as in GPT-2 and T5 v1.1."""
    return F.gelu(x, approximate="tanh")


# ffn name -> (activation, gated)
ACTIVATIONS = {
    "relu": (F.relu, False),
    "gelu": (F.gelu, False),
    "gelu-tanh": (gelu_tanh, False),
    "geglu": (F.gelu, True),
    "geglu-tanh": (gelu_tanh, True),
    "swiglu": (F.silu, True),
}


def activation(cfg: ModelConfig):
    """The element-wise non-linearity of `cfg.ffn` (also used by heads' transforms)."""
    return ACTIVATIONS[cfg.ffn][0]


class FeedForward(nn.Module):
    """FFN(x) = W2 act(W1 x); gated variants use W2 (act(W1 x) * V x) (GLU Variants, eq. 5-6)."""

    def __init__(self, cfg: ModelConfig, d_ff: int | None = None) -> None:
        """d_ff: this layer's hidden units where FFN pruning left fewer (cfg.ffn_sizes)."""
        super().__init__()
        self.act, gated = ACTIVATIONS[cfg.ffn]
        d_ff = d_ff or cfg.d_ff
        self.up = nn.Linear(cfg.d_model, d_ff, bias=cfg.ffn_bias)
        self.gate = nn.Linear(cfg.d_model, d_ff, bias=cfg.ffn_bias) if gated else None
        self.down = nn.Linear(d_ff, cfg.d_model, bias=cfg.ffn_bias)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d_model) -> (B, T, d_ff)
        """The hidden units act(W1 x), or act(W1 x) * V x for gated variants (act on the gate)."""
        if self.gate is None:
            return self.act(self.up(x))
        return self.act(self.gate(x)) * self.up(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d_model)
        # dropout is applied by the block after `down` (BERT, GPT-2)
        return self.down(self.hidden(x))
