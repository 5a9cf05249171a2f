"""The one block stack, and the per-forward context every layer of it shares."""
from __future__ import annotations

import torch
from torch import nn

from lmforge.config import BIDIRECTIONAL_ONLY, ModelConfig
from lmforge.layers.attention import AttentionContext
from lmforge.layers.block import Block
from lmforge.layers.norms import make_norm
from lmforge.layers.patterns import default_global_tokens, pattern_bias, pattern_mask
from lmforge.layers.positions import BIASES, Rotary

PER_LAYER = ("bigbird",)  # patterns whose mask differs from layer to layer (random blocks)
WINDOWED = ("sliding-window", "dilated", "longformer")  # their masks differ where the windows do


def additive(allowed, bias, dtype):
    """Combine a bool mask (True = visible) and an additive bias into one additive bias.

    Hidden positions get the dtype's most negative finite value rather than -inf, so a
    query that sees nothing (a padded position) gets a uniform average, never NaN."""
    if allowed is None:
        return bias
    base = bias if bias is not None else torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, base.to(dtype), torch.finfo(dtype).min)


def _mask_key(cfg: ModelConfig, pattern: str, layer: int) -> str:
    """Layers with equal masks share one: a pattern's, unless random blocks or windows vary by layer."""
    if pattern in PER_LAYER:
        return f"{pattern}@{layer}"
    if cfg.window_schedule and pattern in WINDOWED:
        return f"{pattern}@w{cfg.layer_window(layer)}"
    return pattern


class Stack(nn.Module):
    """n_layers blocks (one shared block under ALBERT sharing), position scheme, final norm."""

    def __init__(self, cfg: ModelConfig, n_layers: int, causal: bool, cross: bool) -> None:
        super().__init__()
        self.cfg, self.causal, self.n_layers = cfg, causal, n_layers
        if cross:  # decoder of an encoder-decoder: encoder-only patterns become full attention
            local = cfg.attention if cfg.attention not in BIDIRECTIONAL_ONLY else "full"
            self.patterns = [local] * n_layers
        else:
            self.patterns = cfg.layer_patterns()
        n_blocks = 1 if cfg.share_layers else n_layers
        self.blocks = nn.ModuleList(Block(cfg, self.patterns[i], cross) for i in range(n_blocks))
        self.mask_keys = [_mask_key(cfg, p, i) for i, p in enumerate(self.patterns)]
        self.bias = BIASES[cfg.position](cfg, not causal) if cfg.position in BIASES else None
        self.rotary = Rotary(cfg) if cfg.position == "rotary" else None
        self.final_norm = make_norm(cfg) if cfg.has_final_norm else None

    def context(self, x, position_ids, past: int, key_padding, global_tokens=None,
                segments=None, cache=None, return_probs=False) -> AttentionContext:
        """Masks, biases and rotations for one forward pass, computed once for all layers."""
        B, T, _ = x.shape
        device = x.device
        q_pos = torch.arange(past, past + T, device=device)
        k_pos = torch.arange(past + T, device=device)
        if "longformer" in self.patterns and global_tokens is None:
            global_tokens = default_global_tokens(self.cfg, B, T, device)
        elif global_tokens is not None:
            global_tokens = global_tokens.bool()  # a 0/1 mask as the reference library takes it
        ctx = AttentionContext(q_pos, k_pos, key_padding=key_padding, global_tokens=global_tokens,
                               segments=segments, cache=cache, return_probs=return_probs)
        bias = self.bias(q_pos, k_pos) if self.bias is not None else None
        padding = key_padding[:, None, None, :] if key_padding is not None else None
        for key, pattern, layer in zip(self.mask_keys, self.patterns, range(self.n_layers)):
            if key in ctx.biases:
                continue
            allowed = pattern_mask(self.cfg, pattern, q_pos, k_pos, self.causal, global_tokens, layer)
            if padding is not None and pattern != "linformer":
                allowed = padding if allowed is None else allowed & padding
            extra = pattern_bias(self.cfg, pattern, q_pos, k_pos, layer)
            layer_bias = bias if extra is None else extra if bias is None else bias + extra
            ctx.biases[key] = additive(allowed, layer_bias, x.dtype)
        if self.rotary is not None:
            ctx.rope = self.rotary(position_ids)
        return ctx

    def forward(self, x: torch.Tensor, ctx: AttentionContext, keep_hidden: bool = False) -> tuple:
        """x (B, T, d_model) -> final hidden states, per-layer hidden states, per-layer probs."""
        hidden, probs = [x] if keep_hidden else None, []
        for layer in range(self.n_layers):
            block = self.blocks[0 if self.cfg.share_layers else layer]
            x, layer_probs = block(x, ctx, layer, self.mask_keys[layer])
            probs.append(layer_probs)
            if keep_hidden:
                hidden.append(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if keep_hidden:
                hidden[-1] = x
        return x, hidden, probs
