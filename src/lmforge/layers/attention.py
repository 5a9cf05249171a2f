"""Multi-head attention (Vaswani et al. 2017, sec. 3.2) with GQA/MQA, cross-attention and a KV cache.

Self-attention is one path, qkv -> positions -> cache -> kernel -> out:

- qkv: one fused projection, split into heads in the layout of the layer's kernel;
- positions: T5's and ALiBi's biases are already in the mask bias (one per stack); rotary
  rotates q and k, XL's relative terms shift q and add a per-layer bias (layers/positions.py);
- cache: earlier keys and values (a KVCache while decoding; XLNet's memory), then the pattern's
  key/value transform where it has one (Linformer, layers/variants/linformer.py);
- kernel: the backend the model's forward chose for the layer's mask (`ctx.kernel_for`): the
  dense `DenseKernel` here (SDPA), blocked local attention and packed rows in lmforge/fast/;
- out: heads merged back in the kernel's layout, gated where an analysis asks, and projected.

Attention probabilities are never a kernel's business: where an analysis records a layer
(layers/inspection.py), they are recomputed from the q, k and bias the kernel attended with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.config import ModelConfig
from lmforge.layers.inspection import Record, StackInspection, eager_probabilities, gate_heads
from lmforge.layers.variants.linformer import LinformerProjection
from lmforge.layers.variants.xl_relative import XLRelativeBias


def attend(q, k, v, bias=None, dropout_p: float = 0.0, scale: float = 1.0, return_probs: bool = False,
           drop=None):
    """softmax(q k^T * scale + bias) v. q (B, H, Tq, dh); k, v (B, Hkv, Tk, dh); bias additive,
    broadcastable to (B, H, Tq, Tk). Returns (out (B, H, Tq, dh), probs or None). drop(probs, p):
    a dropout of one's own, run on the explicit path (default: SDPA's own, or F.dropout)."""
    if k.shape[1] != q.shape[1]:  # GQA/MQA: each kv head serves n_heads / n_kv_heads query heads
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if not return_probs and not (drop is not None and dropout_p):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
        return out, None
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    out = torch.matmul((drop or F.dropout)(probs, dropout_p) if dropout_p else probs, v)
    return out, (probs if return_probs else None)


def split_heads(fused: torch.Tensor, n_heads: int, n_kv: int, dh: int) -> tuple:
    """A fused projection (B, T, (H + 2 Hkv) dh) -> q (B, H, T, dh), k and v (B, Hkv, T, dh), as views.
    One view of the fused output, split once: no copy of q, k or v."""
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
        if (buffers is None or past is None or not _views_of(past[0], buffers[0], k)
                or end > buffers[0].shape[2]):
            buffers = tuple(_grown(old, new, end) for old, new in zip(past or (None, None), (k, v)))
            self._buffers[layer] = buffers
        else:  # write the new positions into the grown buffers in place
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


class DenseKernel:
    """The plain attention backend on the padded (B, H, T, dh) layout: `attend` by SDPA. Other
    backends (lmforge/fast/kernels.py) offer the same three calls."""

    def heads(self, fused: torch.Tensor, n_heads: int, n_kv: int, dh: int) -> tuple:
        """A fused projection (B, T, (H + 2 Hkv) dh) -> q (B, H, T, dh), k and v (B, Hkv, T, dh)."""
        return split_heads(fused, n_heads, n_kv, dh)

    def attend(self, q, k, v, bias, dropout_p: float, scale: float) -> tuple:
        """(out (B, H, T, dh), None); see `attend`."""
        return attend(q, k, v, bias, dropout_p, scale)

    def merge(self, out: torch.Tensor) -> torch.Tensor:
        """(B, H, T, dh) -> (B, T, H dh), the output projection's input."""
        B, H, T, dh = out.shape
        return out.transpose(1, 2).reshape(B, T, H * dh)


DENSE = DenseKernel()  # stateless: one instance, so that a compiled forward builds no object per call


@dataclass
class AttentionContext:
    """What every layer of one stack's forward pass shares: masks and positions (Stack.context),
    and the attention backend of each mask (chosen by the model's forward)."""

    q_pos: torch.Tensor  # (Tq,) absolute positions of the queries
    k_pos: torch.Tensor  # (Tk,) absolute positions of the keys (cached + new)
    # mask key -> additive (B|1, H|1, Tq, Tk), None, or a kernel's plan
    biases: dict = field(default_factory=dict)
    rope: Optional[tuple] = None  # positions.Rotation: (cos, sin), each (B|1, 1, Tq, r)
    key_padding: Optional[torch.Tensor] = None  # (B, Tk) True at real tokens
    global_tokens: Optional[torch.Tensor] = None  # (B, T) Longformer global positions
    # (G,) their positions where known without reading them (the default)
    global_rows: Optional[torch.Tensor] = None
    cache: Optional[KVCache] = None  # or anything with KVCache.extend (XLNet's memory)
    cross_bias: Optional[torch.Tensor] = None  # (B, 1, 1, Tsrc) encoder padding
    memory: Optional[torch.Tensor] = None  # (B, Tsrc, d_model) encoder output
    # mask key -> causal, for masks of padding (+ causality) only
    padding_only: dict = field(default_factory=dict)
    kernel: object = DENSE  # the backend of every layer, unless `kernels` names one
    kernels: dict = field(default_factory=dict)  # mask key -> the backend of that mask's layers
    inspection: Optional[StackInspection] = None  # head gates and attention records (analysis)

    def kernel_for(self, mask_key) -> object:
        """The attention backend that the layers of `mask_key` run."""
        return self.kernels.get(mask_key, self.kernel)


class Attention(nn.Module):
    """Self- or cross-attention with n_heads query and n_kv_heads key/value heads."""

    def __init__(self, cfg: ModelConfig, pattern: str = "full", cross: bool = False, n_heads=None) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.dh = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        # heads pruned physically (compress/head_pruning.py):
        if n_heads is not None and n_heads != cfg.n_heads:
            # MHA only (config checks), so the key/value heads go with their query heads
            self.n_heads = self.n_kv = n_heads
        self.pattern, self.cross = pattern, cross
        q_dim, kv_dim = self.n_heads * self.dh, self.n_kv * self.dh
        if cross:
            self.q = nn.Linear(cfg.d_model, q_dim, bias=cfg.attention_bias)
            self.kv = nn.Linear(cfg.d_model, 2 * kv_dim, bias=cfg.attention_bias)
        else:  # fused projection: one matmul for q, k and v
            self.qkv = nn.Linear(cfg.d_model, q_dim + 2 * kv_dim, bias=cfg.attention_bias)
        self.out = nn.Linear(q_dim, cfg.d_model, bias=cfg.attention_bias)
        self.scale = 1.0 / math.sqrt(self.dh) if cfg.attention_scaling else 1.0
        self.dropout_p = cfg.attention_dropout
        # the pattern's key/value transform, and the position scheme's per-layer terms
        self.linformer = LinformerProjection(cfg) if not cross and pattern == "linformer" else None
        self.xl = XLRelativeBias(cfg) if not cross and cfg.position == "xl-relative" else None

    def forward(self, x: torch.Tensor, ctx: AttentionContext, layer: int, mask_key=None) -> tuple:
        """x (B, T, d_model), or an unpadded batch's (N, d_model) rows -> the same shape, and the
        attention probabilities (B, H, Tq, Tk) or None."""
        if self.cross:
            return self._cross(x, ctx, layer)
        kernel = ctx.kernel_for(mask_key)
        fused = self.qkv(x)  # (B, T, (H + 2 Hkv) dh), or (N, ...) rows of an unpadded batch
        q, k, v = kernel.heads(fused, self.n_heads, self.n_kv, self.dh)  # (B, H|Hkv, T, dh) when padded
        q, k, bias = self.positions(q, k, ctx, ctx.biases.get(mask_key))
        if ctx.cache is not None:
            k, v = ctx.cache.extend(layer, k, v)
        if self.linformer is not None:  # keys and values projected along the sequence: all visible
            (k, v), bias = self.linformer(k, v, ctx.key_padding), None
        out, _ = self._attend(x, q, k, v, bias, ctx, kernel)
        probs = self._inspect(ctx, "self", layer, x, Record(None, q, k, v, self.scale), bias, kernel)
        return self.out(self.gated(kernel.merge(out), ctx, "self", layer)), probs

    def positions(self, q: torch.Tensor, k: torch.Tensor, ctx: AttentionContext, bias) -> tuple:
        """The position scheme's step: (q, k, bias) after the rotation of q and k (rotary) or with
        the per-layer relative terms (XL) added; other schemes' biases are in `bias` already."""
        step = self.xl if self.xl is not None else ctx.rope
        if step is None:
            return q, k, bias
        q, k, extra = step(q, k, ctx)
        return q, k, extra if bias is None else bias if extra is None else bias + extra

    def _attend(self, x, q, k, v, bias, ctx: AttentionContext, kernel) -> tuple:
        # the kernel step (a subclass with rows of its own recomputes them after it: variants/longformer.py)
        return kernel.attend(q, k, v, bias, self.dropout_p if self.training else 0.0, self.scale)

    def _inspect(self, ctx: AttentionContext, kind: str, layer: int, x, record: Record, bias, kernel):
        """The layer's probabilities (B, H, Tq, Tk), kept with its q, k, v, when an analysis records
        it; else None (and nothing is computed)."""
        if ctx.inspection is None or not ctx.inspection.wants(layer):
            return None
        record.probs = self.probabilities(x, record.q, record.k, bias, ctx, kernel)
        # q, k, v may be views of a buffer the next layer's projection writes again (an optimized model
        # reuses one for outputs that die in their layer): what an analysis keeps is a copy
        record.q, record.k, record.v = (t.clone() for t in (record.q, record.k, record.v))
        ctx.inspection.keep(kind, layer, record)
        return record.probs

    def probabilities(self, x, q, k, bias, ctx: AttentionContext, kernel) -> torch.Tensor:
        """softmax(scale q k^T + bias) from what `kernel` attended with (a padded layout's)."""
        return eager_probabilities(q, k, bias, self.scale)

    def gated(self, merged: torch.Tensor, ctx: AttentionContext, kind: str, layer: int) -> torch.Tensor:
        """Heads' outputs times their gates xi_h (Michel et al. 2019) where an analysis sets them."""
        gate = ctx.inspection.gate(kind, layer) if ctx.inspection is not None else None
        return merged if gate is None else gate_heads(merged, gate)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:  # (B, T, n*dh) -> (B, n, T, dh)
        B, T, _ = x.shape
        return x.view(B, T, n, self.dh).transpose(1, 2)

    def keys_values(self, states: torch.Tensor) -> tuple:
        """Self-attention keys and values (B, Hkv, S, dh) of other states (B, S, d_model): a
        Transformer-XL memory, or the content stream that XLNet's query stream reads."""
        q_dim, kv_dim = self.n_heads * self.dh, self.n_kv * self.dh
        bias = self.qkv.bias[q_dim:] if self.qkv.bias is not None else None
        k, v = F.linear(states, self.qkv.weight[q_dim:], bias).split(kv_dim, dim=-1)
        return self._heads(k, self.n_kv), self._heads(v, self.n_kv)

    def _cross(self, x: torch.Tensor, ctx: AttentionContext, layer: int) -> tuple:
        """Queries from x (B, T, d_model), keys and values from the encoder's output (computed once
        while decoding: it does not change); no position terms."""
        q = self._heads(self.q(x), self.n_heads)
        if ctx.cache is not None and layer in ctx.cache.cross_kv:
            k, v = ctx.cache.cross_kv[layer]
        else:
            k, v = (self._heads(t, self.n_kv) for t in self.kv(ctx.memory).chunk(2, dim=-1))
            if ctx.cache is not None:
                ctx.cache.cross_kv[layer] = (k, v)
        out, _ = self._attend(x, q, k, v, ctx.cross_bias, ctx, ctx.kernel)
        probs = self._inspect(ctx, "cross", layer, x, Record(None, q, k, v, self.scale), ctx.cross_bias,
                              ctx.kernel)
        return self.out(self.gated(ctx.kernel.merge(out), ctx, "cross", layer)), probs
