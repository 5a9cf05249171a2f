"""Linformer (Wang et al. 2020): keys and values projected along the sequence to k rows.

Attention applies it as its key/value transform, after the cache and before the kernel
(layers/attention.py): every projected key is then visible, so the mask bias is dropped.
"""
from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ModelConfig


class LinformerProjection(nn.Module):
    """E, F in R^{k x n} (sec. 4, eq. 7); shared across heads ("headwise sharing"), one per layer.

    Sequences shorter than n use the first T columns, the paper's treatment of short inputs;
    padded keys are zeroed first so padding cannot leak into the projected keys."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.E = nn.Parameter(torch.empty(cfg.linformer_k, cfg.max_seq_len))
        self.F = nn.Parameter(torch.empty(cfg.linformer_k, cfg.max_seq_len))

    def forward(self, k: torch.Tensor, v: torch.Tensor, key_padding: torch.Tensor | None) -> tuple:
        # k, v: (B, H, T, d_head) -> (B, H, k, d_head); key_padding: (B, T) True at real tokens
        length = k.shape[2]
        if key_padding is not None:
            keep = key_padding[:, None, :, None].to(k.dtype)
            k, v = k * keep, v * keep
        k = torch.einsum("kn,bhnd->bhkd", self.E[:, :length].to(k.dtype), k)
        v = torch.einsum("kn,bhnd->bhkd", self.F[:, :length].to(v.dtype), v)
        return k, v
