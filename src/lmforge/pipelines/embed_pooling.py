"""Sentence-transformers' poolings of encoder states: (B, T, d) states and a (B, T) mask -> (B, d).

Batches are right-padded; `without_first` leaves each row's leading tokens (a prompt's, where a model's
include_prompt is false) out of the mask the poolings read.
"""
from __future__ import annotations

import torch

from lmforge.heads import pool


def _mean(hidden, mask, sqrt_len: bool = False):
    m = mask[..., None].to(hidden.dtype)
    n = m.sum(1).clamp(min=1e-9)
    return (hidden * m).sum(1) / (n.sqrt() if sqrt_len else n)


def _weighted_mean(hidden, mask):
    # later tokens weigh more (position 1..T), as in SGPT's weighted mean pooling
    w = mask[..., None].to(hidden.dtype) * torch.arange(1, hidden.shape[1] + 1, device=hidden.device,
                                                         dtype=hidden.dtype)[None, :, None]
    return (hidden * w).sum(1) / w.sum(1).clamp(min=1e-9)


# each (B, T, d), (B, T) -> (B, d); batches are right-padded (cls: the first token the mask keeps)
POOLINGS = {
    "mean": _mean,
    "mean_sqrt_len_tokens": lambda h, m: _mean(h, m, sqrt_len=True),
    "cls": lambda h, m: h[torch.arange(h.shape[0], device=h.device), m.int().argmax(1)],  # first one kept
    "max": lambda h, m: h.masked_fill(m[..., None] == 0, float("-inf")).max(1).values,
    "weightedmean": _weighted_mean,
    "lasttoken": lambda h, m: pool(h, m, "last"),
}


def without_first(mask: torch.Tensor, skip) -> torch.Tensor:
    """The attention mask with each row's first `skip` kept tokens left out (padding on either side); skip:
    one number for every row, or a (B,) tensor of one a row (a batch mixes texts of different prompts)."""
    first = mask.int().argmax(1, keepdim=True)
    at = torch.arange(mask.shape[1], device=mask.device)[None, :]
    return mask.masked_fill(at < first + (skip[:, None] if torch.is_tensor(skip) else skip), 0)


def pooling_mask(mask: torch.Tensor, skip, rows: list) -> torch.Tensor:
    """The mask the poolings read for a batch of the texts at `rows`: each row's first kept tokens left out,
    `skip` of them (SentenceEncoder.encode's: one number for every text, or a list of one a text)."""
    if isinstance(skip, list):
        skip = torch.tensor([skip[i] for i in rows], device=mask.device)
        return without_first(mask, skip) if bool(skip.any()) else mask
    return without_first(mask, skip) if skip else mask
