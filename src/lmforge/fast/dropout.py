"""Dropout (Srivastava et al. 2014) with a cheaper mask on CPU (FastDropout, swapped in by lmforge.optimize).

torch draws dropout masks on CPU one float per element from a single-threaded Mersenne Twister,
which made dropout about a fifth of a bert-mini MLM step in both libraries (bench/FINDINGS.md).
Here one 64-bit draw gives four 16-bit uniforms, each compared with p quantised to 2^-16: the
mask costs ~4x less (2 M elements: 7.6 vs 29 ms). The keep probability is (2^16 - round(p 2^16))
/ 2^16 (p = 0.1 keeps 0.899994) and kept values are scaled by its inverse, so E[dropout(x)] = x exactly.
Masks still come from torch's default generator: seeded runs repeat, and a resumed run that
restores the generator's state draws the same masks. Other devices keep F.dropout (Philox there).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

LEVELS = 1 << 16  # uniforms per 16-bit lane


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Zero each element of x with probability p (to 2^-16) and scale the rest by 1 / P(keep)."""
    if not training or p == 0.0:
        return x
    dropped = round(p * LEVELS)
    if x.device.type != "cpu" or not 0 < dropped < LEVELS or x.dtype not in (torch.float32, torch.bfloat16,
                                                                             torch.float16):
        return F.dropout(x, p, training)  # elsewhere, and p outside (2^-17, 1 - 2^-17): torch's own
    n = x.numel()
    # the full int64 range: every bit of each draw is random (random_() would leave the sign bit 0)
    words = torch.randint(-(1 << 63), (1 << 63) - 1, ((n + 3) // 4,), dtype=torch.int64, device=x.device)
    lanes = words.view(torch.int16)[:n].view(x.shape)  # uniform in [-2^15, 2^15)
    keep = lanes >= dropped - LEVELS // 2  # P = (LEVELS - dropped) / LEVELS
    # where() saves only the bool mask for backward, as native dropout does
    return torch.where(keep, x, 0.0).mul_(LEVELS / (LEVELS - dropped))


class FastDropout(nn.Dropout):
    """nn.Dropout (same `p`, same train/eval behaviour) drawing its mask with `dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return F.dropout(x, self.p, self.training, inplace=True)
        return dropout(x, self.p, self.training)
