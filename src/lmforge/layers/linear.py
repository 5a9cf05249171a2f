"""The projections of attention and feed-forward layers: nn.Linear with a leaner CPU inference path.

F.linear with a bias runs addmm: it first copies the bias into every row of a fresh (N, out)
output, then has the matrix product accumulate onto it, which reads that output back. In CPU
inference the product can instead write the fresh output and the bias be added into it while it
is still warm: bert-mini with lengths 8..128 (unpadded, 2168 rows) gains 3-10 % a batch, bert-base
is unchanged within noise (bench/FINDINGS.md). The sum is the same up to where the
bias joins it (bitwise equal on the bench's shapes); autograd, autocast and other devices keep
F.linear.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# below this many rows (a decoding step has one per sequence) the output is small and addmm's
# single call is cheaper than two
MIN_ROWS = 64


def bias_after(x: torch.Tensor, weight: torch.Tensor, bias) -> bool:
    """Whether x W^T + b is computed as a plain matmul plus an in-place bias (see the module doc)."""
    return (bias is not None and not torch.is_grad_enabled() and x.device.type == "cpu"
            and x.dtype == weight.dtype and not torch.is_autocast_enabled("cpu")
            and x.numel() >= MIN_ROWS * x.shape[-1])


class Linear(nn.Linear):
    """y = x W^T + b (weights and state-dict names as nn.Linear's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        if bias_after(x, self.weight, self.bias):
            return torch.matmul(x, self.weight.t()).add_(self.bias)
        return F.linear(x, self.weight, self.bias)
