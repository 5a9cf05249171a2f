"""Position-wise feed-forward networks: plain (Vaswani et al. 2017) and gated (Shazeer 2020)."""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.config import ModelConfig
from lmforge.layers.linear import Linear


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


# in-place forms, for inference: an activation that overwrites its input allocates nothing (a
# bert-mini batch of 32 x 128 allocates 16 MB per layer for it, bench/FINDINGS.md)
IN_PLACE = {F.relu: torch.relu_, F.gelu: torch.ops.aten.gelu_,
            gelu_tanh: lambda x: torch.ops.aten.gelu_(x, approximate="tanh"), F.silu: partial(F.silu, inplace=True)}


def activate(act, h: torch.Tensor) -> torch.Tensor:
    """act(h), in place when nothing needs h for a backward pass (h is a fresh projection output)."""
    return act(h) if h.requires_grad or act not in IN_PLACE else IN_PLACE[act](h)


def activation(cfg: ModelConfig):
    """The element-wise non-linearity of `cfg.ffn` (also used by heads' transforms)."""
    return ACTIVATIONS[cfg.ffn][0]


class FeedForward(nn.Module):
    """FFN(x) = W2 act(W1 x); gated variants use W2 (act(W1 x) * V x) (GLU Variants, eq. 5-6)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.act, gated = ACTIVATIONS[cfg.ffn]
        self.up = Linear(cfg.d_model, cfg.d_ff, bias=cfg.ffn_bias)
        self.gate = Linear(cfg.d_model, cfg.d_ff, bias=cfg.ffn_bias) if gated else None
        self.down = Linear(cfg.d_ff, cfg.d_model, bias=cfg.ffn_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d_model)
        # the hidden units die here: in CPU inference they reuse a buffer (Linear.transient)
        if self.gate is None:
            h = activate(self.act, self.up.transient(x, "ffn.up"))
        else:  # act on the gate, as in SwiGLU / GEGLU
            h = activate(self.act, self.gate.transient(x, "ffn.gate")) * self.up.transient(x, "ffn.up")
        # dropout is applied by the block after `down` (BERT, GPT-2); T5 also drops inside
        return self.down(h)
