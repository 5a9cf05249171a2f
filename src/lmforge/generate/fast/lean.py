"""Cached decoding steps without the general stack's per-call plumbing: same arithmetic, fewer calls.

A decoding step feeds each row's new position through every layer. At small batches its matmuls
are matrix-vector products bound by memory bandwidth, and what the general path adds around them
(module calls, per-layer feature checks, the split of the fused projection into heads) was about
a tenth of a GPT-2 small step on CPU (bench/FINDINGS.md). `LeanDecoder` gathers every layer's
weights once per generate call and runs the layers as a flat sequence of tensor calls. What differs
between families still comes from the model's own code: embeddings and positions (Embeddings),
masks, ALiBi, T5's relative bias, sliding windows and rotations (Stack.context), the cache
(KVCache.extend; an encoder-decoder's cross-attention keys and values, cached by the first step)
and the attention kernel (`attend`), so every decoder that generation meets gives the same tokens
either way (tests/test_decode_step.py).
"""
from __future__ import annotations

from functools import partial
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.layers.attention import KVCache, attend, split_heads
from lmforge.layers.block import add_residual
from lmforge.layers.feedforward import activate
from lmforge.layers.patterns import cross_bias
from lmforge.layers.positions import apply_rotary


def lean_decoding_supported(model: nn.Module) -> bool:
    """Whether `model` can decode through LeanDecoder: a decoder or an encoder-decoder whose decoder
    self-attention has no Transformer-XL terms, Linformer projection or Longformer global projections."""
    stack = getattr(model, "decoder", None)
    if model.config.architecture not in ("decoder", "encoder-decoder") or stack is None:
        return False
    return all(b.attn.xl is None and b.attn.linformer is None and b.attn.global_qkv is None
               for b in stack.blocks)


def _linear(module: nn.Linear) -> tuple:
    # (in, out) view of the weight: addmm reads it as F.linear does, one dispatch fewer
    return module.weight.t(), module.bias


def _apply(x: torch.Tensor, linear: tuple) -> torch.Tensor:  # (N, in) -> (N, out)
    weight, bias = linear
    return torch.addmm(bias, x, weight) if bias is not None else torch.mm(x, weight)


def _norm(module: nn.Module):
    """The norm as a plain call: F.layer_norm for nn.LayerNorm, else the module's own forward."""
    if isinstance(module, nn.LayerNorm):
        return partial(F.layer_norm, normalized_shape=module.normalized_shape, weight=module.weight,
                       bias=module.bias, eps=module.eps)
    return module.forward


class LeanDecoder:
    """A decoder's layers as gathered weights, for cached steps; built per generate call because
    weights may be relaid out between calls (layers/fastpath.py weight_layout)."""

    def __init__(self, model: nn.Module, memory_mask: Optional[torch.Tensor] = None) -> None:
        """memory_mask (B, S): an encoder-decoder's source padding, 1 at real tokens (None: none)."""
        if not lean_decoding_supported(model):
            raise ValueError("LeanDecoder needs a decoder with plain self-attention "
                             "(see lean_decoding_supported)")
        if model.training:
            raise ValueError("LeanDecoder runs eval-mode steps (no dropout): call model.eval() first")
        self.model, self.stack = model, model.decoder
        stack, cfg = self.stack, model.config
        self.cross = cfg.architecture == "encoder-decoder"
        self.embed = model.decoder_embed if self.cross else model.embed
        self.cross_bias = None if memory_mask is None else cross_bias(memory_mask, model.tokens.weight.dtype)
        self.pre_norm = cfg.norm_placement == "pre"
        blocks = [stack.blocks[0 if cfg.share_layers else i] for i in range(stack.n_layers)]
        self.layers = [self._gather(block) for block in blocks]
        self.final_norm = _norm(stack.final_norm) if stack.final_norm is not None else None

    @staticmethod
    def _gather(block: nn.Module) -> tuple:
        attn, ffn, cross = block.attn, block.ffn, block.cross_attn
        heads = (attn.n_heads, attn.n_kv, attn.dh, attn.scale)
        gate = _linear(ffn.gate) if ffn.gate is not None else None
        if cross is not None:  # an encoder-decoder's: queries only, keys and values come from the cache
            cross_heads = (cross.n_heads, cross.dh, cross.scale)
            cross = (_norm(block.cross_norm), _linear(cross.q), _linear(cross.out), cross_heads)
        return (_norm(block.attn_norm), _linear(attn.qkv), _linear(attn.out), heads, cross,
                _norm(block.ffn_norm), _linear(ffn.up), gate, _linear(ffn.down), ffn.act)

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor],
                 position_ids: Optional[torch.Tensor], cache: KVCache,
                 prefix_lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """input_ids (B, T) after cache.length cached positions; attention_mask (B, cached + T) ->
        (B, T, d_model) final hidden states, as the model's forward with run_heads=False."""
        model, past = self.model, cache.length
        if self.cross and len(cache.cross_kv) < self.stack.n_layers:
            raise ValueError("an encoder-decoder's lean steps read the cross-attention keys and values "
                             "that the first (general) decoding step caches")
        x, position_ids = model._embed(self.embed, input_ids, position_ids, None, past)
        key_padding = attention_mask.bool() if attention_mask is not None else None
        ctx = self.stack.context(x, position_ids, past, key_padding, cache=cache,
                                 prefix_lengths=prefix_lengths, fast=model.fast)
        B, T, d = x.shape
        x = x.reshape(B * T, d)
        for layer, weights in enumerate(self.layers):
            bias = ctx.biases.get(self.stack.mask_keys[layer])
            x = self._block(x, weights, layer, (B, T), bias, ctx)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x.view(B, T, d)

    def _block(self, x, weights, layer: int, shape: tuple, bias, ctx) -> torch.Tensor:
        """One layer on (B*T, d_model) rows: the Block's pre- or post-norm residual order."""
        norm1, qkv, out, heads, cross, norm2, up, gate, down, act = weights
        if self.pre_norm:
            x = add_residual(self._attention(norm1(x), qkv, out, heads, layer, shape, bias, ctx), x)
            if cross is not None:
                x = add_residual(self._cross_attention(cross[0](x), cross, layer, shape, ctx), x)
            return add_residual(self._ffn(norm2(x), up, gate, down, act), x)
        x = norm1(add_residual(self._attention(x, qkv, out, heads, layer, shape, bias, ctx), x))
        if cross is not None:
            x = cross[0](add_residual(self._cross_attention(x, cross, layer, shape, ctx), x))
        return norm2(add_residual(self._ffn(x, up, gate, down, act), x))

    def _cross_attention(self, h, cross, layer, shape, ctx) -> torch.Tensor:
        _, q_proj, out, (n_heads, dh, scale) = cross
        B, T = shape
        q = _apply(h, q_proj).view(B, T, n_heads, dh).transpose(1, 2)  # (B, H, T, dh)
        k, v = ctx.cache.cross_kv[layer]  # the encoder's, projected once by the first step
        o, _ = attend(q, k, v, self.cross_bias, 0.0, scale)
        return _apply(o.transpose(1, 2).reshape(B * T, n_heads * dh), out)

    @staticmethod
    def _attention(h, qkv, out, heads, layer, shape, bias, ctx) -> torch.Tensor:
        n_heads, n_kv, dh, scale = heads
        B, T = shape
        q, k, v = split_heads(_apply(h, qkv).view(B, T, -1), n_heads, n_kv, dh)
        if ctx.rope is not None:
            q, k = apply_rotary(q, *ctx.rope), apply_rotary(k, *ctx.rope)
        k, v = ctx.cache.extend(layer, k, v)
        o, _ = attend(q, k, v, bias, 0.0, scale)  # (B, H, T, dh)
        return _apply(o.transpose(1, 2).reshape(B * T, n_heads * dh), out)

    @staticmethod
    def _ffn(h, up, gate, down, act) -> torch.Tensor:
        # FeedForward.forward: act on the gate for GLU variants, else on the up projection
        if gate is not None:
            return _apply(activate(act, _apply(h, gate)) * _apply(h, up), down)
        return _apply(activate(act, _apply(h, up)), down)
