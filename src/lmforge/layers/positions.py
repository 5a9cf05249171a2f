"""Position schemes behind two interfaces (x-transformers style).

* absolute schemes add a vector to the token embedding: `learned`, `sinusoidal`;
* attention schemes act inside attention: `relative-bias` (T5) and `alibi` give an additive
  score bias (1|B, H, Tq, Tk), computed once per stack and folded into every layer's mask bias;
  `rotary` gives a `Rotation`, and `xl-relative` (layers/variants/xl_relative.py) has per-layer
  terms. Those two are attention's position step, one call `step(q, k, ctx) -> (q, k, bias or
  None)`: the rotation turns q and k, the XL terms shift q and add a bias.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from lmforge.config import ModelConfig


# --- absolute ------------------------------------------------------------------
def sinusoidal_table(n_positions: int, dim: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...) (Vaswani et al. 2017, sec. 3.5)."""
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]
    inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)[:, : dim // 2]
    return table.float()


def default_positions(cfg: ModelConfig, input_ids: torch.Tensor, mask, past: int) -> torch.Tensor:
    """(1, T) positions past .. past + T - 1; with cfg.position_from_padding (B, T): each real token's count
    among its row's real tokens (the (B, past + T) mask's, else the ids that are not pad_token_id), from
    past, and -1 at padding, as the reference RoBERTa derives them, so that a left-padded row reads the
    unpadded row's positions."""
    T = input_ids.shape[1]
    known = mask is not None or cfg.pad_token_id is not None
    if cfg.position_from_padding and cfg.position == "learned" and known:
        real = (mask[:, -T:] if mask is not None else input_ids != cfg.pad_token_id).to(torch.long)
        return (real.cumsum(1) + past) * real - 1
    return torch.arange(past, past + T, device=input_ids.device)[None]


class LearnedPositions(nn.Module):
    """A trained vector per absolute position (BERT, GPT); RoBERTa/BART start at an offset."""

    def __init__(self, cfg: ModelConfig, dim: int) -> None:
        super().__init__()
        self.offset = cfg.position_offset
        self.weight = nn.Parameter(torch.empty(cfg.max_seq_len + cfg.position_offset, dim))

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:  # (B|1, T) -> (B|1, T, E)
        return nn.functional.embedding(position_ids + self.offset, self.weight)


class SinusoidalPositions(nn.Module):
    """Fixed sinusoids, a buffer not a parameter (so they are neither trained nor saved)."""

    def __init__(self, cfg: ModelConfig, dim: int) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_table(cfg.max_seq_len, dim), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table[position_ids]


ABSOLUTE = {"learned": LearnedPositions, "sinusoidal": SinusoidalPositions}


# --- T5 relative bias ------------------------------------------------------------
def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool,
                             num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's bucket of (key - query): exact below num_buckets/2 (per side), log-spaced up to max_distance."""
    bucket = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        bucket += (relative_position > 0).long() * num_buckets  # keys after the query get their own half
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)  # a causal query never sees later keys
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return bucket + torch.where(is_small, distance, large)


class RelativeBias(nn.Module):
    """T5's learned scalar bias per (bucket, head), computed once per stack (Raffel et al. 2020, 2.1)."""

    def __init__(self, cfg: ModelConfig, bidirectional: bool) -> None:
        super().__init__()
        self.bidirectional = bidirectional
        self.num_buckets, self.max_distance = cfg.relative_buckets, cfg.relative_max_distance
        self.weight = nn.Parameter(torch.empty(cfg.relative_buckets, cfg.n_heads))

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:  # -> (1, H, Tq, Tk)
        buckets = relative_position_bucket(k_pos[None, :] - q_pos[:, None], self.bidirectional,
                                           self.num_buckets, self.max_distance)
        return self.weight[buckets].permute(2, 0, 1)[None]


# --- ALiBi -------------------------------------------------------------------------
def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Head slopes 2^(-8h/n) (Press et al. 2022, sec. 3); for n not a power of two, the
    slopes of the nearest lower power of two, then every other slope of twice that."""
    def geometric(n: int) -> list:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    closest = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = geometric(closest) + geometric(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes)


class ALiBi(nn.Module):
    """Linear distance penalty -m_h |i - j| added to the scores; no parameters."""

    def __init__(self, cfg: ModelConfig, bidirectional: bool) -> None:
        super().__init__()
        self.bidirectional = bidirectional
        self.register_buffer("slopes", alibi_slopes(cfg.n_heads), persistent=False)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:  # -> (1, H, Tq, Tk)
        distance = (q_pos[:, None] - k_pos[None, :]).float()
        # causal rows only meet j <= i; softmax ignores a per-row constant, so this equals
        # the paper's m * (j - i) and BLOOM's m * j on the positions that are attended. |i - j|
        # also for causal stacks: equal on those keys, and a prefix LM's prefix sees later keys
        distance = distance.abs()
        return -(self.slopes[:, None, None] * distance)[None]


BIASES = {"relative-bias": RelativeBias, "alibi": ALiBi}


# --- rotary ----------------------------------------------------------------------------
def llama3_frequencies(inv_freq: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Llama 3.1's RoPE scaling (Meta 2024): wavelengths longer than original/low_freq_factor are
    stretched by the factor, those shorter than original/high_freq_factor kept, and the band
    between interpolated linearly in original/wavelength."""
    wavelength_ratio = cfg.rotary_original_max_len * inv_freq / (2 * math.pi)  # original / wavelength
    low, high = cfg.rotary_low_freq_factor, cfg.rotary_high_freq_factor
    keep = ((wavelength_ratio - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - keep) * inv_freq / cfg.rotary_scaling_factor + keep * inv_freq


# rotary_scaling -> (inv_freq (r/2,), cfg) -> scaled inv_freq; "linear" is position interpolation
# (Chen et al. 2023): every position p becomes p / factor
ROTARY_SCALINGS = {
    "none": lambda inv_freq, cfg: inv_freq,
    "linear": lambda inv_freq, cfg: inv_freq / cfg.rotary_scaling_factor,
    "llama3": llama3_frequencies,
}


class Rotary(nn.Module):
    """RoPE (Su et al. 2021): rotate pairs (x_i, x_{i+d/2}) of the first rotary_dim dims by p * theta_i."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        dim = cfg.rotary_width
        inv_freq = 1.0 / cfg.rotary_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        inv_freq = ROTARY_SCALINGS[cfg.rotary_scaling](inv_freq, cfg)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> "Rotation":  # (B|1, T) -> cos, sin (B|1, 1, T, r)
        angles = position_ids[..., None].float() * self.inv_freq  # (B, T, r/2)
        angles = torch.cat([angles, angles], dim=-1)[:, None]
        return Rotation(angles.cos(), angles.sin())


class Rotation(NamedTuple):
    """One forward pass's rotary angles (cos, sin), each (B|1, 1, T, r): attention's position step."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __call__(self, q: torch.Tensor, k: torch.Tensor, ctx=None) -> tuple:
        """(q, k) (B, H|Hkv, T, d_head) rotated by their positions' angles; no score bias."""
        return apply_rotary(q, self.cos, self.sin), apply_rotary(k, self.cos, self.sin), None


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the leading cos.shape[-1] dims of x (B, H, T, d_head); the rest pass through."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half1, half2 = rot[..., : r // 2], rot[..., r // 2:]
    rotated = torch.cat([-half2, half1], dim=-1)
    return torch.cat([(rot * cos + rotated * sin).to(x.dtype), rest], dim=-1)
