"""Multi-head attention (Vaswani et al. 2017, sec. 3.2) with GQA/MQA, cross-attention and a KV cache.

One kernel, `attend`, serves every pattern: torch's fused scaled-dot-product
attention, or, when the caller wants to look at them, an explicit softmax that
also returns the probabilities and gives the same outputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.config import ModelConfig
from lmforge.layers.blocked import ChunkPlan, blocked_attend
from lmforge.layers.dropout import dropout
from lmforge.layers.linear import Linear
from lmforge.layers.linformer import LinformerProjection
from lmforge.layers.packing import Packing
from lmforge.layers.positions import apply_rotary
from lmforge.layers.xl_relative import XLRelativeBias


def attend(q, k, v, bias=None, dropout_p: float = 0.0, scale: float = 1.0, return_probs: bool = False):
    """softmax(q k^T * scale + bias) v. q (B, H, Tq, dh); k, v (B, Hkv, Tk, dh); bias additive,
    broadcastable to (B, H, Tq, Tk). Returns (out (B, H, Tq, dh), probs or None)."""
    if k.shape[1] != q.shape[1]:  # GQA/MQA: each kv head serves n_heads / n_kv_heads query heads
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    # attention dropout sends CPU SDPA to its math path anyway: the same steps here draw a cheaper mask
    if not return_probs and not (dropout_p and q.device.type == "cpu"):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
        return out, None
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    out = torch.matmul(dropout(probs, dropout_p) if dropout_p else probs, v)
    return out, (probs if return_probs else None)


def split_heads(fused: torch.Tensor, n_heads: int, n_kv: int, dh: int) -> tuple:
    """A fused projection (B, T, (H + 2 Hkv) dh) -> q (B, H, T, dh), k and v (B, Hkv, T, dh), as views.
    One view, transpose and tensor_split rather than three of each: 6 vs 22 us a layer (bench/FINDINGS.md)."""
    B, T, _ = fused.shape
    heads = fused.view(B, T, n_heads + 2 * n_kv, dh).transpose(1, 2)
    return heads.tensor_split([n_heads, n_heads + n_kv], dim=1)


class KVCache:
    """Keys and values of earlier positions, per layer, for incremental decoding.

    Self-attention entries grow by the new positions each step; cross-attention entries
    (the encoder's keys and values) are computed once and reused. Self-attention entries
    are views of preallocated buffers whose capacity doubles when full, so a step copies
    only its own keys (concatenation would copy the whole cache at every step)."""

    def __init__(self) -> None:
        self.self_kv: dict = {}  # layer -> (k, v) (B, Hkv, length, dh): views of the buffers
        self.cross_kv: dict = {}
        self._buffers: dict = {}  # layer -> (K, V) (B, Hkv, capacity, dh)

    @property
    def length(self) -> int:
        """Number of positions already cached."""
        return self.self_kv[0][0].shape[2] if self.self_kv else 0

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple:
        """Append this step's (B, Hkv, T, dh) keys/values; return all cached ones."""
        past = self.self_kv.get(layer)
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            # in-place writes would break autograd's saved views: concatenate instead
            if past is not None:
                k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            self.self_kv[layer] = (k, v)
            return k, v
        n = past[0].shape[2] if past is not None else 0
        end = n + k.shape[2]
        buffers = self._buffers.get(layer)
        if buffers is None or past is None or not _views_of(past[0], buffers[0], k) or end > buffers[0].shape[2]:
            buffers = tuple(_grown(old, new, end) for old, new in zip(past or (None, None), (k, v)))
            self._buffers[layer] = buffers
        else:  # narrow rather than indexing with slices: a few us less per call, which decoding steps see
            buffers[0].narrow(2, n, end - n).copy_(k)
            buffers[1].narrow(2, n, end - n).copy_(v)
        self.self_kv[layer] = (buffers[0].narrow(2, 0, end), buffers[1].narrow(2, 0, end))
        return self.self_kv[layer]

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep self-attention entries of `rows` (N,) in that order (beam search). Each row must
        come from a row of the same input, so the encoder's keys and values stay as they are."""
        for layer, (k, v) in self.self_kv.items():
            buffers = self._buffers.get(layer)
            if buffers is not None and _views_of(k, buffers[0], k):  # rewrite in place: views stay valid
                k.copy_(k.index_select(0, rows))
                v.copy_(v.index_select(0, rows))
            else:
                self.self_kv[layer] = (k.index_select(0, rows), v.index_select(0, rows))


def _views_of(view: torch.Tensor, buffer: torch.Tensor, new: torch.Tensor) -> bool:
    """Whether `view` is still the front of `buffer` and `new` rows fit its layout (reorder and
    callers that replace self_kv entries leave views that are not)."""
    return (view.data_ptr() == buffer.data_ptr() and view.stride() == buffer.stride()
            and view.shape[:2] == new.shape[:2] == buffer.shape[:2] and new.dtype == buffer.dtype)


def _grown(old, new: torch.Tensor, end: int) -> torch.Tensor:
    """A buffer of capacity max(2 * end, 64) holding old (B, H, n, dh) then new (B, H, T, dh)."""
    B, H, _, dh = new.shape
    buffer = new.new_empty(B, H, max(2 * end, 64), dh)
    n = 0 if old is None else old.shape[2]
    if old is not None:
        buffer[:, :, :n].copy_(old)
    buffer[:, :, n:end].copy_(new)
    return buffer


@dataclass
class AttentionContext:
    """What every layer of one stack's forward pass shares (built once by the stack)."""

    q_pos: torch.Tensor  # (Tq,) absolute positions of the queries
    k_pos: torch.Tensor  # (Tk,) absolute positions of the keys (cached + new)
    biases: dict = field(default_factory=dict)  # mask key -> additive (B|1, H|1, Tq, Tk) or None
    rope: Optional[tuple] = None  # (cos, sin), each (B|1, 1, Tq, r)
    key_padding: Optional[torch.Tensor] = None  # (B, Tk) True at real tokens
    global_tokens: Optional[torch.Tensor] = None  # (B, T) Longformer global positions
    segments: Optional[torch.Tensor] = None  # (B, Tk) for XLNet's segment term
    cache: Optional[KVCache] = None
    return_probs: bool = False
    cross_bias: Optional[torch.Tensor] = None  # (B, 1, 1, Tsrc) encoder padding
    memory: Optional[torch.Tensor] = None  # (B, Tsrc, d_model) encoder output
    mems: Optional[list] = None  # per layer (B, M, d_model): Transformer-XL memory (two_stream.py)
    packing: Optional[Packing] = None  # unpadded batch: layers see (N, d_model), attention re-pads
    padding_only: dict = field(default_factory=dict)  # mask key -> causal, for masks of padding (+ causality) only


class Attention(nn.Module):
    """Self- or cross-attention with n_heads query and n_kv_heads key/value heads."""

    def __init__(self, cfg: ModelConfig, pattern: str = "full", cross: bool = False) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.dh = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.pattern, self.cross = pattern, cross
        q_dim, kv_dim = self.n_heads * self.dh, self.n_kv * self.dh
        if cross:
            self.q = Linear(cfg.d_model, q_dim, bias=cfg.attention_bias)
            self.kv = Linear(cfg.d_model, 2 * kv_dim, bias=cfg.attention_bias)
        else:  # fused projection: one matmul for q, k and v
            self.qkv = Linear(cfg.d_model, q_dim + 2 * kv_dim, bias=cfg.attention_bias)
        self.out = Linear(q_dim, cfg.d_model, bias=cfg.attention_bias)
        self.scale = 1.0 / math.sqrt(self.dh) if cfg.attention_scaling else 1.0
        self.dropout_p = cfg.attention_dropout
        own = not cross
        self.global_qkv = (Linear(cfg.d_model, q_dim + 2 * kv_dim, bias=cfg.attention_bias)
                           if own and cfg.global_projections and pattern == "longformer" else None)
        self.linformer = LinformerProjection(cfg) if own and pattern == "linformer" else None
        self.xl = XLRelativeBias(cfg) if own and cfg.position == "xl-relative" else None

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:  # (B, T, n*dh) -> (B, n, T, dh)
        B, T, _ = x.shape
        return x.view(B, T, n, self.dh).transpose(1, 2)

    def _split(self, fused: torch.Tensor) -> tuple:
        return split_heads(fused, self.n_heads, self.n_kv, self.dh)

    def keys_values(self, states: torch.Tensor) -> tuple:
        """Self-attention keys and values (B, Hkv, S, dh) of other states (B, S, d_model): a
        Transformer-XL memory, or the content stream that XLNet's query stream reads."""
        q_dim, kv_dim = self.n_heads * self.dh, self.n_kv * self.dh
        bias = self.qkv.bias[q_dim:] if self.qkv.bias is not None else None
        k, v = F.linear(states, self.qkv.weight[q_dim:], bias).split(kv_dim, dim=-1)
        return self._heads(k, self.n_kv), self._heads(v, self.n_kv)

    def forward(self, x: torch.Tensor, ctx: AttentionContext, layer: int, mask_key=None) -> tuple:
        """x (B, T, d_model) -> (B, T, d_model), attention probabilities or None."""
        if self.cross:
            q, k, v = self._cross_qkv(x, ctx, layer)
            bias = ctx.cross_bias
        else:
            fused = self.qkv.transient(x, "attn.qkv")  # q, k, v never outlive this call (KVCache copies)
            if self._sequence_wise(ctx, mask_key):  # packed rows, one attention call per sequence
                return self._per_sequence(fused, ctx, mask_key), None
            q, k, v = self._split(self._padded(fused, ctx))
            if ctx.rope is not None:
                q, k = apply_rotary(q, *ctx.rope), apply_rotary(k, *ctx.rope)
            if ctx.cache is not None:
                k, v = ctx.cache.extend(layer, k, v)
            if ctx.mems is not None:  # the previous segment's layer inputs as extra keys/values
                k_mem, v_mem = self.keys_values(ctx.mems[layer])
                k, v = torch.cat([k_mem, k], dim=2), torch.cat([v_mem, v], dim=2)
            bias = ctx.biases.get(mask_key)
            if self.linformer is not None:
                k, v = self.linformer(k, v, ctx.key_padding)
                bias = None  # every projected key is visible
            if self.xl is not None:
                xl = self.xl(q, k, ctx.q_pos, ctx.k_pos, ctx.segments, self.scale)
                bias = xl if bias is None else bias + xl
        p = self.dropout_p if self.training else 0.0
        if isinstance(bias, ChunkPlan):  # a windowed pattern in query chunks (layers/blocked.py)
            out, probs = blocked_attend(q, k, v, bias, p, self.scale), None
        else:
            out, probs = attend(q, k, v, bias, p, self.scale, ctx.return_probs)
        if self.global_qkv is not None and ctx.global_tokens is not None:
            out = self._longformer_global(x, out, ctx)
        if ctx.packing is not None:
            return self.out(ctx.packing.pack_heads(out)), probs
        B, H, T, dh = out.shape
        return self.out(out.transpose(1, 2).reshape(B, T, H * dh)), probs

    def _sequence_wise(self, ctx: AttentionContext, mask_key) -> bool:
        # the padded path's mask is only padding (and causality): nothing needs the (B, T) layout
        return (ctx.packing is not None and ctx.packing.by_sequence and mask_key in ctx.padding_only
                and ctx.rope is None and not ctx.return_probs and ctx.cache is None and ctx.mems is None
                and self.xl is None and self.linformer is None and self.global_qkv is None)

    def _per_sequence(self, fused: torch.Tensor, ctx: AttentionContext, mask_key) -> torch.Tensor:
        q_dim, kv_dim = self.n_heads * self.dh, self.n_kv * self.dh
        q, k, v = fused.split([q_dim, kv_dim, kv_dim], dim=-1)  # (N, ...)
        q, k, v = q.unflatten(-1, (self.n_heads, self.dh)), *(t.unflatten(-1, (self.n_kv, self.dh)) for t in (k, v))
        p = self.dropout_p if self.training else 0.0
        out = ctx.packing.attend(q, k, v, ctx.padding_only[mask_key], p, self.scale)  # (N, H, dh)
        return self.out(out.flatten(1))

    @staticmethod
    def _padded(fused: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        # packed (N, ...) rows back to (B, T, ...): attention needs each sequence on its own
        return ctx.packing.unpack(fused) if ctx.packing is not None else fused

    def _cross_qkv(self, x: torch.Tensor, ctx: AttentionContext, layer: int) -> tuple:
        q = self._heads(self.q(x), self.n_heads)
        if ctx.cache is not None and layer in ctx.cache.cross_kv:
            k, v = ctx.cache.cross_kv[layer]  # the encoder output does not change while decoding
        else:
            k, v = (self._heads(t, self.n_kv) for t in self.kv(ctx.memory).chunk(2, dim=-1))
            if ctx.cache is not None:
                ctx.cache.cross_kv[layer] = (k, v)
        return q, k, v

    def _longformer_global(self, x: torch.Tensor, local: torch.Tensor, ctx: AttentionContext):
        """Longformer sec. 3.1: global rows are recomputed with their own projections over all keys."""
        rows = ctx.global_tokens.any(0).nonzero().squeeze(1)  # (G,) global in some row of the batch
        if not rows.numel():
            return local
        q, k, v = self._split(self._padded(self.global_qkv(x), ctx))
        bias = None
        if ctx.key_padding is not None:
            bias = torch.zeros(ctx.key_padding.shape, dtype=q.dtype, device=q.device)
            bias = bias.masked_fill(~ctx.key_padding, torch.finfo(q.dtype).min)[:, None, None, :]
        p = self.dropout_p if self.training else 0.0
        glob, _ = attend(q[:, :, rows], k, v, bias, p, self.scale)  # (B, H, G, dh): G x T, not T x T
        chosen = ctx.global_tokens[:, rows][:, None, :, None]  # (B, 1, G, 1)
        return local.index_copy(2, rows, torch.where(chosen, glob, local[:, :, rows]))
