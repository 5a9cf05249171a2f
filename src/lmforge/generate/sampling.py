"""Choosing the next token from scores: greedy, temperature, top-k (Fan et al. 2018), top-p
(nucleus, Holtzman et al. 2020)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class Sampling:
    """How the next token is chosen from the logits (greedy unless do_sample), checked by
    GenerationOptions."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter


def filter_top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest scores of each row; the rest become -inf."""
    k = min(k, scores.shape[-1])
    kth = scores.topk(k, dim=-1).values[..., -1:]
    return scores.masked_fill(scores < kth, float("-inf"))


def filter_top_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of highest-probability tokens whose mass reaches p (at least one)."""
    # the reference's arithmetic: ascending order, drop while the mass of the worst tokens is <= 1 - p, so
    # the same tokens stay where tied scores straddle the boundary (a descending sort kept the lower ids of a
    # tie, the reference the higher ones) or the mass lands on it within float rounding
    ordered, order = scores.sort(dim=-1, descending=False)
    drop = ordered.softmax(-1).cumsum(-1) <= (1 - p)
    drop[..., -1] = False
    return scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def argmax_rows(scores: torch.Tensor, block: int = 128) -> torch.Tensor:
    """(N, V) -> (N,) each row's argmax (its first maximum; NaN counts as the maximum, as in argmax).

    On CPU, argmax over a vocabulary runs ~7x slower than amax (50257 logits: ~100 vs 13 us a row,
    bench/FINDINGS.md), so the maximum is found among block maxima first, then inside its block.
    The last block is the row's final `block` scores: it overlaps the one before when V is not a
    multiple, and an overlapped maximum is found first in the earlier block, as argmax finds it."""
    N, V = scores.shape
    n = V // block
    if scores.device.type != "cpu" or n < 2 or scores.stride(-1) != 1:
        return scores.argmax(-1)
    maxima = torch.cat([scores[:, :n * block].view(N, n, block).amax(-1),
                        scores[:, V - block:].amax(-1, keepdim=True)], dim=1)  # (N, n + 1)
    # (N,) first score of the chosen block: the last block (best == n) starts at V - block
    start = (maxima.argmax(-1) * block).clamp_(max=V - block)
    window = start[:, None] + torch.arange(block, device=scores.device)
    return start + scores.gather(1, window).argmax(-1)


def divide(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """scores / temperature, as the reference divides them (the same bits, so the same distribution)."""
    scaled = scores / temperature
    # one reduction a step decides the common case (every row's top quotient finite: nothing overflowed
    # that softmax would read); the exact test runs only behind it
    if temperature < 1.0 and not bool(scaled.amax(-1).isfinite().all()) \
            and bool((~scaled.isfinite() & scores.isfinite()).any()):
        # a tiny temperature overflows the quotients to inf (softmax NaN), or is 0 in float32: the top
        # score shifted to 0 (softmax is shift-invariant) and a divisor >= float32's tiny keep every
        # quotient <= 0, the top one 0, so the limit is greedy
        scores = scores - scores.amax(-1, keepdim=True)
        scaled = scores / max(temperature, torch.finfo(scores.dtype).tiny)
    return scaled


def next_tokens(scores: torch.Tensor, rule: Sampling,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """(B, V) processed next-position scores -> (B,) chosen token ids."""
    scores = scores.float()
    if not rule.do_sample:
        return argmax_rows(scores)
    scores = divide(scores, rule.temperature)
    if rule.top_k:
        scores = filter_top_k(scores, rule.top_k)
    if rule.top_p < 1.0:
        scores = filter_top_p(scores, rule.top_p)
    return torch.multinomial(scores.softmax(-1), 1, generator=generator).squeeze(-1)
