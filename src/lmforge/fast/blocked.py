"""Local attention computed in blocks: each chunk of C queries against its key band.

The windowed patterns (sliding-window, dilated, Longformer, BigBird) let a query see
O(w) keys, but a dense (T, T) mask still costs O(T^2) time and memory. Here the queries
are cut into chunks; a chunk's candidate keys are its band [s - left, s + C - 1 + right]
plus the pattern's extra columns (Longformer's global tokens; BigBird's global and random
blocks), so scores are (T, C + left + right + extras): linear in T. Rows that see every key
(global tokens) are recomputed against all keys, also linear. Which candidates are really
visible is decided by the pattern definitions in patterns.py, evaluated on each chunk's
positions, so the result equals the dense-mask reference path (tests/layers/test_fastpath.py).
The model's forward asks `blocked_layers` which masks to compute so, and puts their `plans`
in the context in place of dense masks, with fast/kernels.py's BlockedKernel to run them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from lmforge.config import ModelConfig
from lmforge.layers.patterns import additive, bigbird_random_blocks, pattern_bias, pattern_mask

BLOCKED = ("sliding-window", "dilated", "longformer", "bigbird")


@dataclass
class ChunkPlan:
    """Blocked attention of one pattern in one forward pass (shared by the layers that use it)."""

    size: int  # C, queries per chunk
    keys: torch.Tensor  # (n, K) index of every chunk's candidate keys: its band (L), then extra keys
    bias: torch.Tensor  # (B|1, n, H|1, C, K) additive: pattern mask, padding, position bias
    rows: Optional[torch.Tensor] = None  # (G,) queries that see every key (global tokens)
    rows_bias: Optional[torch.Tensor] = None  # (B|1, H|1, G, Tk)
    left: int = 0  # chunk i's band is positions i * C - left + [0, band)
    band: int = 0  # L = C + left + right
    blind: Optional[torch.Tensor] = None  # (B|1, T) queries that see no key at all (padding), or None


def reach(cfg: ModelConfig, pattern: str, causal: bool, layer: int) -> tuple:
    """(left, right): how far before and after itself a query's band of keys extends."""
    if pattern == "bigbird":  # chunks are blocks: the 3-block window is one block either side
        return cfg.block_size, cfg.block_size
    step = cfg.dilation if pattern == "dilated" else 1
    window = cfg.layer_window(layer)
    return (step * (window - 1), 0) if causal else (step * (window // 2), step * (window // 2))


def chunk_size(cfg: ModelConfig, pattern: str, left: int, right: int, chosen: int = 0) -> int:
    """C: BigBird's block; otherwise about a quarter of the band (wasted scores ~ C / band; an eighth
    measured the same: the saving goes to per-call overhead, bench/FINDINGS.md)."""
    if pattern == "bigbird":
        return cfg.block_size
    return chosen or max(16, min(256, (left + right) // 4))


def band_width(cfg: ModelConfig, pattern: str, causal: bool, layer: int, chunk: int = 0) -> int:
    """K, about how many keys one chunk scores (band plus extra columns)."""
    left, right = reach(cfg, pattern, causal, layer)
    extra = {"longformer": cfg.n_global_tokens,
             "bigbird": (2 + cfg.n_random_blocks) * cfg.block_size}.get(pattern, 0)
    return chunk_size(cfg, pattern, left, right, chunk) + left + right + extra


def pays(cfg: ModelConfig, pattern: str, causal: bool, layer: int, T: int, fast) -> bool:
    """Whether `pattern` runs in query chunks at length T under `fast` (fast/paths.FastPaths):
    asked for, or "auto" and a chunk scores fewer keys than the sequence has (bench/RESULTS.md: at
    T = 1024 with a 512 window the blocked path is ~1.07x full attention, the dense mask 0.8x)."""
    if fast.local_attention == "dense" or pattern not in BLOCKED:
        return False
    if pattern == "bigbird" and T <= cfg.dense_max_len:
        return False  # full attention at this length
    return fast.local_attention == "blocked" or band_width(cfg, pattern, causal, layer, fast.chunk) < T


def blocked_layers(stack, fast, T: int) -> dict:
    """mask key -> (pattern, first layer) of the masks of `stack` (layers/stack.py) that run in
    query chunks at length T; a mask's first layer decides for every layer sharing it."""
    chosen, seen = {}, set()
    for key, pattern, layer in zip(stack.mask_keys, stack.patterns, range(stack.n_layers)):
        if key not in seen and pays(stack.cfg, pattern, stack.causal, layer, T, fast):
            chosen[key] = (pattern, layer)
        seen.add(key)
    return chosen


def plans(stack, ctx, chosen: dict, dtype, chunk: int = 0) -> dict:
    """mask key -> ChunkPlan of every chosen mask, from the context's positions, padding and
    global tokens and the stack's position bias (queries == keys: no cache offset)."""
    return {key: plan(stack.cfg, pattern, ctx.q_pos, ctx.k_pos, stack.causal, layer, ctx.key_padding,
                      ctx.global_tokens, stack.bias, dtype, chunk)
            for key, (pattern, layer) in chosen.items()}


def _extra_keys(cfg, pattern, n: int, T: int, global_tokens, layer: int):
    """(n, E) extra candidate key positions per chunk (global / random columns), or None."""
    if pattern == "longformer":
        cols = global_tokens.any(0).nonzero().squeeze(1)  # (G,) union over the batch
        return cols[None].expand(n, -1) if cols.numel() else None
    if pattern != "bigbird":
        return None
    last = (T - 1) // cfg.block_size
    blocks = torch.tensor([0, last]).expand(n, 2)
    if cfg.random_block_choice == "seeded" and cfg.n_random_blocks:
        chosen = bigbird_random_blocks(cfg, last + 1, layer)  # (n, n) bool; n == blocks here
        r = min(cfg.n_random_blocks, last + 1)
        order = chosen.float().argsort(dim=1, descending=True, stable=True)[:, :r]
        picked = torch.where(chosen.gather(1, order), order, 0)  # unfilled slots: block 0 again
        blocks = torch.cat([blocks, picked], dim=1)
    # a block adjacent to the query block is already in the band (and block 0 may repeat)
    near = (blocks - torch.arange(n)[:, None]).abs() <= 1
    first_seen = torch.zeros_like(near)
    for j in range(blocks.shape[1]):
        first_seen[:, j] = ~(blocks[:, :j] == blocks[:, j:j + 1]).any(1)
    blocks = torch.where(near | ~first_seen, -1, blocks)
    offsets = torch.arange(cfg.block_size)
    positions = blocks[:, :, None] * cfg.block_size + offsets  # (n, E/bs, bs)
    return torch.where(blocks[:, :, None] < 0, -1, positions).flatten(1)


def candidates(cfg: ModelConfig, pattern: str, T: int, C: int, left: int, right: int,
               global_tokens, layer: int) -> tuple:
    """(keys (n, K) clamped into [0, T), valid (n, K) bool): each chunk's band and extra keys,
    every key at most once."""
    n = -(-T // C)
    starts = torch.arange(n) * C
    band = starts[:, None] - left + torch.arange(C + left + right)  # (n, L)
    extra = _extra_keys(cfg, pattern, n, T, None if global_tokens is None else global_tokens.cpu(), layer)
    if extra is None:
        keys = band
        valid = (band >= 0) & (band < T)
    else:
        in_band = (extra >= band[:, :1]) & (extra <= band[:, -1:])
        keys = torch.cat([band, extra], dim=1)
        valid = (keys >= 0) & (keys < T)
        valid[:, band.shape[1]:] &= ~in_band
    return keys.clamp(0, T - 1), valid


def plan(cfg: ModelConfig, pattern: str, q_pos, k_pos, causal: bool, layer: int, key_padding,
         global_tokens, position_bias, dtype, chunk: int = 0) -> ChunkPlan:
    """The ChunkPlan of `pattern` for queries q_pos == keys k_pos (no cache offset)."""
    T, device = k_pos.numel(), k_pos.device
    left, right = reach(cfg, pattern, causal, layer)
    C = chunk_size(cfg, pattern, left, right, chunk)
    keys, valid = (t.to(device) for t in candidates(cfg, pattern, T, C, left, right, global_tokens, layer))
    n = keys.shape[0]
    qp = (torch.arange(n * C, device=device).clamp(max=T - 1) + q_pos[0]).view(n, C)  # padded rows: discarded
    kp = k_pos[keys]  # (n, K)
    allowed = _chunk_mask(cfg, pattern, qp, kp, left, C + left + right, causal, global_tokens, layer)
    allowed = allowed & valid[None, :, None, None, :]  # (B|1, n, 1, C|1, K)
    if key_padding is not None:
        allowed = allowed & key_padding[:, keys][:, :, None, None, :]
    bias = _chunk_bias(cfg, pattern, qp, kp, layer, position_bias)
    bias = additive(allowed, bias, dtype).expand(-1, -1, -1, C, -1)
    B = allowed.shape[0]  # the padding's or the global tokens' batch (either may be given alone), or 1
    # every pattern's band holds the query itself, so only padding leaves a query blind (tested): without
    # it no mask is built (on a GPU it would be applied in every layer, unasked)
    blind = None if key_padding is None else _blind(allowed, C, T)
    out = ChunkPlan(C, keys, bias.expand(B, -1, -1, -1, -1).contiguous(),  # (B, n, H|1, C, K)
                    left=left, band=C + left + right, blind=blind)
    rows = _global_rows(cfg, pattern, T, global_tokens)
    if rows is not None:
        out.rows = rows.to(device)
        out.rows_bias = _rows_bias(cfg, pattern, q_pos[out.rows], k_pos, causal, layer, key_padding,
                                   global_tokens, position_bias, dtype)
    return out


def _blind(allowed: torch.Tensor, C: int, T: int):
    """(B|1, T) queries none of whose candidates is visible, or None: the dense mask hides every key from
    them too (a band holds all a query may see), and dense SDPA gives such a row the uniform average of
    all T values (every score the same finfo.min), not of its band's. A per-token head or a decoder
    cross-attending to a row of padding only reads those rows."""
    blind = ~allowed.any(-1).expand(-1, -1, -1, C).flatten(1)[:, :T]  # (B|1, nC) -> (B|1, T)
    if blind.is_cuda:  # asking whether any is would make the host wait for the GPU: applied always
        return blind
    return blind if bool(blind.any()) else None


def _chunk_mask(cfg, pattern, qp, kp, left: int, band: int, causal: bool, global_tokens, layer: int):
    """(B|1, n, 1, C|1, K) candidates visible to each chunk's rows, from the definitions in patterns.py
    (global rows excepted: they are recomputed). Bands depend on i - j only, so one chunk's band
    serves every chunk; BigBird's mask is constant on blocks, so one position per block serves."""
    if pattern == "bigbird":
        bs = cfg.block_size
        blocks = pattern_mask(cfg, pattern, qp[:, :1], kp[:, ::bs], causal, None, layer)  # (1, 1, n, 1, K/bs)
        return blocks.repeat_interleave(bs, dim=-1).transpose(1, 2)
    C, K, device = qp.shape[1], kp.shape[1], qp.device
    local = "sliding-window" if pattern == "longformer" else pattern  # Longformer = band | global
    k_band = torch.arange(band, device=device) - left  # positions relative to the chunk's first query
    # (1, 1, C, L)
    mask = pattern_mask(cfg, local, torch.arange(C, device=device), k_band, causal, None, layer)
    mask = torch.cat([mask, mask.new_zeros(1, 1, C, K - band)], dim=-1)[:, None]  # extra columns: see below
    # every query sees its row's global keys (the extra columns), wherever they are
    if pattern == "longformer":
        mask = mask | global_tokens[:, kp][:, :, None, None, :]
    return mask


def _chunk_bias(cfg, pattern, qp, kp, layer, position_bias):
    """(1, n, H|1, C, K) position bias (per chunk: its modules take 1-D positions) + pattern bias."""
    extra = None
    if pattern == "bigbird":  # constant on blocks, as the mask
        bs = cfg.block_size
        extra = pattern_bias(cfg, pattern, qp[:, :1], kp[:, ::bs], layer)  # (1, 1, n, 1, K/bs) or None
        extra = extra.repeat_interleave(bs, dim=-1).transpose(1, 2) if extra is not None else None
    if position_bias is None:
        return extra
    per_chunk = torch.stack([position_bias(q, k)[0] for q, k in zip(qp, kp)])[None]  # (1, n, H, C, K)
    return per_chunk if extra is None else per_chunk + extra


def _global_rows(cfg, pattern, T: int, global_tokens):
    """(G,) queries whose row is dense: Longformer's global tokens, BigBird's first and last block."""
    if pattern == "longformer":
        rows = global_tokens.any(0).nonzero().squeeze(1)
        return rows if rows.numel() else None
    if pattern == "bigbird":
        first = torch.arange(min(cfg.block_size, T))
        last = torch.arange(((T - 1) // cfg.block_size) * cfg.block_size, T)
        return torch.unique(torch.cat([first, last]))
    return None


def _rows_bias(cfg, pattern, q_pos, k_pos, causal, layer, key_padding, global_tokens, position_bias, dtype):
    allowed = pattern_mask(cfg, pattern, q_pos, k_pos, causal, global_tokens, layer)  # (B|1, 1, G, Tk)
    if key_padding is not None:
        allowed = allowed & key_padding[:, None, None, :]
    bias = pattern_bias(cfg, pattern, q_pos, k_pos, layer)
    if position_bias is not None:
        bias = position_bias(q_pos, k_pos) if bias is None else bias + position_bias(q_pos, k_pos)
    return additive(allowed, bias, dtype)


def blocked_attend(q, k, v, plan: ChunkPlan, dropout_p: float = 0.0, scale: float = 1.0):
    """softmax(q k^T * scale + bias) v over each chunk's keys. q (B, H, T, dh); k, v (B, Hkv, T, dh)."""
    if k.shape[1] != q.shape[1]:  # GQA/MQA
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    B, H, T, dh = q.shape
    n, K = plan.keys.shape
    C = plan.size
    if K == plan.band and plan.rows is None:  # a band and nothing else: keys and values stay views
        return _seen_by_none(_attend_bands(q, k, v, plan, dropout_p, scale), v, plan)
    # gather whole token rows (B, T, H, dh): one contiguous copy per key, then strided views
    qc = F.pad(q.transpose(1, 2), (0, 0, 0, 0, 0, n * C - T))  # (B, nC, H, dh)
    qc = qc.view(B, n, C, H, dh).transpose(2, 3).reshape(B * n, H, C, dh)
    kc, vc = (_chunk_keys(t, plan, n) for t in (k, v))
    bias = plan.bias.expand(B, -1, -1, -1, -1).reshape(B * n, -1, C, K)
    out = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=bias, dropout_p=dropout_p, scale=scale)
    out = out.view(B, n, H, C, dh).transpose(2, 3).reshape(B, n * C, H, dh)[:, :T].transpose(1, 2)
    out = _seen_by_none(out, v, plan)
    if plan.rows is not None:  # rows that see every key: exact dense rows, G x T scores
        dense = F.scaled_dot_product_attention(q[:, :, plan.rows], k, v, attn_mask=plan.rows_bias,
                                               dropout_p=dropout_p, scale=scale)
        out = out.index_copy(2, plan.rows, dense)
    return out  # (B, H, T, dh)


def _seen_by_none(out: torch.Tensor, v: torch.Tensor, plan: ChunkPlan) -> torch.Tensor:
    """out (B, H, T, dh) with the plan's blind queries given the mean of all T values v (B, H, T, dh),
    as the dense mask's uniform softmax gives them."""
    if plan.blind is None:
        return out
    return torch.where(plan.blind[:, None, :, None], v.mean(2, keepdim=True), out)


def _attend_bands(q, k, v, plan: ChunkPlan, dropout_p: float, scale: float) -> torch.Tensor:
    """blocked_attend for plans with no extra columns, one attention call per chunk on views of
    k and v clipped to [0, T): no copy of the overlapping bands, which at T = 1024 (8 chunks, band
    640) costs more than the scores it saves (bench/FINDINGS.md). q (B, H, T, dh) -> (B, H, T, dh)."""
    T, C, L = q.shape[2], plan.size, plan.band
    outs = []
    for i in range(plan.keys.shape[0]):
        start, first = i * C, i * C - plan.left  # first query, first band key (may be < 0)
        lo, hi = max(0, first), min(T, first + L)
        rows = min(C, T - start)
        bias = plan.bias[:, i, :, :rows, lo - first:hi - first]  # (B, H|1, rows, hi - lo)
        outs.append(F.scaled_dot_product_attention(q[:, :, start:start + rows], k[:, :, lo:hi],
                                                   v[:, :, lo:hi], attn_mask=bias, dropout_p=dropout_p,
                                                   scale=scale))
    return torch.cat(outs, dim=2)


def _chunk_keys(t: torch.Tensor, plan: ChunkPlan, n: int) -> torch.Tensor:
    """(B, H, T, dh) keys or values -> (B * n, H, K, dh): each chunk's band, then its extra keys.

    Bands overlap and are evenly spaced, so they are one strided view of the zero-padded rows
    (a copy only when reshaped): ~15x faster than gathering them by index. Padded positions are
    outside [0, T), which the plan's mask hides (candidates() marks them invalid)."""
    B, H, T, dh = t.shape
    C, L = plan.size, plan.band
    rows = t.transpose(1, 2)  # (B, T, H, dh)
    padded = F.pad(rows, (0, 0, 0, 0, plan.left, max(0, (n - 1) * C + L - plan.left - T)))  # (B, Tp, H, dh)
    s = padded.stride()
    bands = padded.as_strided((B, n, H, L, dh), (s[0], C * s[1], s[2], s[1], s[3]))
    if plan.keys.shape[1] > L:  # global / random columns: gathered by index
        E = plan.keys.shape[1] - L
        extra = rows.index_select(1, plan.keys[:, L:].flatten()).view(B, n, E, H, dh).transpose(2, 3)
        bands = torch.cat([bands, extra], dim=3)
    return bands.reshape(B * n, H, -1, dh)
