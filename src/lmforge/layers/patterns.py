"""Attention patterns as boolean masks: which key j may query i attend to.

Each pattern is a function `(cfg, q_pos, k_pos, causal, global_tokens, layer) ->
bool tensor (B|1, 1, Tq, Tk)` or None for "no restriction". The model turns the
mask into an additive bias once per stack and every layer of that pattern
reuses it; the dense kernel then equals the pattern's definition exactly. A
block-sparse kernel can replace the dense one per pattern without changing
these definitions, which remain the reference it is tested against.
"""
from __future__ import annotations

import math

import torch

from lmforge.config import ModelConfig


def _offsets(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    # (Tq, Tk): i - j; leading dims broadcast, so blocked attention can ask for (n, C) x (n, K) chunks
    return q_pos[..., :, None] - k_pos[..., None, :]


def full(cfg, q_pos, k_pos, causal, global_tokens, layer):
    """Every query sees every key (causality is added by the stack)."""
    return None


def sliding_window(cfg, q_pos, k_pos, causal, global_tokens, layer):
    """Local band (Longformer sec. 3.1; Mistral): |i-j| <= w/2, or causal i-w < j <= i."""
    offset, window = _offsets(q_pos, k_pos), cfg.layer_window(layer)
    band = (offset >= 0) & (offset < window) if causal else offset.abs() <= window // 2
    return band[None, None]


def dilated(cfg, q_pos, k_pos, causal, global_tokens, layer):
    """Dilated band (Longformer sec. 3.1): every d-th key, w/2 of them per side (w causal)."""
    offset = _offsets(q_pos, k_pos)
    reach = offset if causal else offset.abs()
    on_grid = (offset % cfg.dilation == 0) & (reach >= 0)
    steps, window = reach // cfg.dilation, cfg.layer_window(layer)
    band = on_grid & (steps < window if causal else steps <= window // 2)
    return band[None, None]


def default_global_tokens(cfg: ModelConfig, batch: int, length: int, device) -> torch.Tensor:
    """Longformer's default global tokens: the first `n_global_tokens` ([CLS]); (B, T) bool."""
    tokens = torch.zeros(batch, length, dtype=torch.bool, device=device)
    tokens[:, : cfg.n_global_tokens] = True
    return tokens


def longformer(cfg, q_pos, k_pos, causal, global_tokens, layer):
    """Sliding window plus symmetric global attention (Longformer sec. 3.1): global tokens
    see every token and every token sees them. global_tokens: (B, T) bool."""
    band = sliding_window(cfg, q_pos, k_pos, False, None, layer)  # (1, 1, T, T)
    rows = global_tokens[:, q_pos][:, None, ..., None]  # (B, 1, Tq, 1)
    cols = global_tokens[:, k_pos][:, None, ..., None, :]  # (B, 1, 1, Tk)
    return band | rows | cols


def _last_position(k_pos: torch.Tensor) -> int:
    """The last key position. A stack's keys are 0 .. Tk-1 (cached + new), so a compiled graph takes it
    from their shape rather than read the tensor back (a graph break a layer); other key sets (a blocked
    plan's bands, 2-D) are read."""
    if torch.compiler.is_compiling() and k_pos.dim() == 1:
        return k_pos.shape[0] - 1
    return int(k_pos.max())


# (n_random_blocks, n_blocks, layer, device) -> the drawn blocks, read (never edited) by every layer's
# mask and by a compiled graph: drawn and moved to the device once
_RANDOM_BLOCKS: dict = {}


def bigbird_random_blocks(cfg: ModelConfig, n_blocks: int, layer: int, device=None) -> torch.Tensor:
    """(n_blocks, n_blocks) bool on `device` (default: the CPU): the random key blocks of each query
    block, fixed per layer. Drawn from a generator seeded by (layer, n_blocks), so the pattern is
    reproducible and a sparse kernel can rebuild it; the first and last block are global and get none.
    The cached tensor itself: callers read it."""
    key = (cfg.n_random_blocks, n_blocks, layer, torch.device(device or "cpu"))
    if key not in _RANDOM_BLOCKS:
        _RANDOM_BLOCKS[key] = draw_random_blocks(cfg.n_random_blocks, n_blocks, layer).to(key[-1])
    return _RANDOM_BLOCKS[key]


def draw_random_blocks(n_random: int, n_blocks: int, layer: int) -> torch.Tensor:
    """bigbird_random_blocks' draw itself (uncached): n_random key blocks per middle query block."""
    chosen = torch.zeros(n_blocks, n_blocks, dtype=torch.bool)
    gen = torch.Generator().manual_seed(1_000_003 * (layer + 1) + n_blocks)
    for qb in range(1, n_blocks - 1):
        candidates = [b for b in range(1, n_blocks - 1) if abs(b - qb) > 1]
        if not candidates:
            continue
        pick = torch.randperm(len(candidates), generator=gen)[:n_random]
        chosen[qb, [candidates[i] for i in pick.tolist()]] = True
    return chosen


def bigbird(cfg, q_pos, k_pos, causal, global_tokens, layer):
    """BigBird ITC (Zaheer et al. 2020, sec. 2): blocks of b tokens; each query block sees its
    3-block window, r random blocks and the global first and last blocks, which see everything."""
    end = _last_position(k_pos)  # once: a read-back in eager runs
    if end + 1 <= cfg.dense_max_len:  # short sequences attend fully (as the reference code does)
        return None
    qb, kb = q_pos // cfg.block_size, k_pos // cfg.block_size
    n_blocks = end // cfg.block_size + 1  # the queries are among the keys
    last = n_blocks - 1
    qb, kb = qb[..., :, None], kb[..., None, :]
    window = (qb - kb).abs() <= 1
    glob = (qb == 0) | (qb == last) | (kb == 0) | (kb == last)
    if cfg.random_block_choice == "first":  # every draw is the first block, already seen: see bigbird_bias
        return (window | glob)[None, None]
    random = bigbird_random_blocks(cfg, n_blocks, layer, q_pos.device)[qb, kb]
    return (window | glob | random)[None, None]


def bigbird_bias(cfg, q_pos, k_pos, layer):
    """random_block_choice="first": the middle query blocks see the first block 1 + r times, and r
    duplicates of a key in a softmax weigh it by 1 + r, i.e. add log(1 + r) to its scores."""
    if cfg.random_block_choice != "first" or not cfg.n_random_blocks:
        return None
    end = _last_position(k_pos)
    if end + 1 <= cfg.dense_max_len:
        return None
    qb, kb = q_pos // cfg.block_size, k_pos // cfg.block_size
    last = end // cfg.block_size
    repeated = ((qb > 0) & (qb < last))[..., :, None] & (kb == 0)[..., None, :]  # (Tq, Tk)
    return (repeated.float() * math.log(1 + cfg.n_random_blocks))[None, None]


# patterns that also weigh some keys: an additive (1, 1, Tq, Tk) score bias next to the mask
PATTERN_BIASES = {"bigbird": bigbird_bias}


def pattern_bias(cfg: ModelConfig, pattern: str, q_pos, k_pos, layer: int):
    """The pattern's additive score bias, or None (most patterns only select keys)."""
    return PATTERN_BIASES[pattern](cfg, q_pos, k_pos, layer) if pattern in PATTERN_BIASES else None


# Linformer does not restrict which keys are seen; it projects them (layers/variants/linformer.py).
PATTERNS = {
    "full": full,
    "sliding-window": sliding_window,
    "dilated": dilated,
    "longformer": longformer,
    "bigbird": bigbird,
    "linformer": full,
}


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """(1, 1, Tq, Tk) bool: key j is visible to query i iff j <= i."""
    return (k_pos[..., None, :] <= q_pos[..., :, None])[None, None]


def prefix_keys(k_pos: torch.Tensor, prefix_lengths: torch.Tensor) -> torch.Tensor:
    """(B, 1, 1, Tk) bool: key j lies in example b's prefix (j < P_b). A prefix LM's mask is the
    causal mask OR this: prefix positions see the whole prefix, later ones everything up to
    themselves (Raffel et al. 2020, sec. 3.2.1, fig. 3; Dong et al. 2019, UniLM)."""
    return (k_pos[None, :] < prefix_lengths[:, None])[:, None, None, :]


def additive(allowed, bias, dtype):
    """Combine a bool mask (True = visible) and an additive bias into one additive bias.

    Hidden positions get the dtype's most negative finite value rather than -inf, so a
    query that sees nothing (a padded position) gets a uniform average, never NaN."""
    if allowed is None:
        return bias
    base = bias if bias is not None else torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, base.to(dtype), torch.finfo(dtype).min)


def cross_bias(memory_mask: torch.Tensor, dtype) -> torch.Tensor:
    """(B, S) source padding (1 at real tokens) -> (B, 1, 1, S) additive bias for cross-attention."""
    return additive(memory_mask.bool()[:, None, None, :], None, dtype)


def pattern_mask(cfg: ModelConfig, pattern: str, q_pos, k_pos, causal: bool,
                 global_tokens, layer: int):
    """The pattern's mask intersected with causality; None means every key is visible."""
    mask = PATTERNS[pattern](cfg, q_pos, k_pos, causal, global_tokens, layer)
    if causal:
        causal_part = causal_mask(q_pos, k_pos)
        mask = causal_part if mask is None else mask & causal_part
    return mask
