"""The one block stack, and the per-forward context every layer of it shares."""
from __future__ import annotations

import torch
from torch import nn

from lmforge.config import BIDIRECTIONAL_ONLY, ModelConfig
from lmforge.layers.attention import DENSE, AttentionContext
from lmforge.layers.block import Block
from lmforge.layers.norms import make_norm
from lmforge.layers.patterns import additive, default_global_tokens, pattern_bias, pattern_mask, prefix_keys
from lmforge.layers.positions import BIASES, Rotary

PER_LAYER = ("bigbird",)  # patterns whose mask differs from layer to layer (random blocks)
WINDOWED = ("sliding-window", "dilated", "longformer")  # their masks differ where the windows do


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
        name = "decoder" if causal else "encoder"
        heads = [(cfg.layer_heads(name, i), cfg.layer_heads("cross", i)) for i in range(n_blocks)]
        self.blocks = nn.ModuleList(Block(cfg, self.patterns[i], cross, heads[i], cfg.layer_d_ff(name, i))
                                    for i in range(n_blocks))
        self.mask_keys = [_mask_key(cfg, p, i) for i, p in enumerate(self.patterns)]
        self.bias = BIASES[cfg.position](cfg, not causal) if cfg.position in BIASES else None
        self.rotary = Rotary(cfg) if cfg.position == "rotary" else None
        self.final_norm = make_norm(cfg) if cfg.has_final_norm else None

    def context(self, x, position_ids, past: int, key_padding, global_tokens=None, cache=None,
                prefix_lengths=None, skip=()) -> AttentionContext:
        """Masks, biases and rotations for one forward pass, computed once for all layers;
        prefix_lengths (B,) turns a causal stack's mask into a prefix LM's; `skip`: mask keys that
        get no dense mask, as the caller puts another plan there (the model's blocked attention)."""
        B, T, _ = x.shape
        q_pos = torch.arange(past, past + T, device=x.device)
        k_pos = torch.arange(past + T, device=x.device)
        ctx = AttentionContext(q_pos, k_pos, key_padding=key_padding, cache=cache, kernel=DENSE,
                               global_tokens=self._global_tokens(global_tokens, B, T, x.device))
        # the default: the first tokens
        if global_tokens is None and ctx.global_tokens is not None and self.cfg.n_global_tokens:
            ctx.global_rows = torch.arange(min(self.cfg.n_global_tokens, T), device=x.device)
        bias = self.bias(q_pos, k_pos) if self.bias is not None else None
        prefix = self._prefix(k_pos, prefix_lengths, B) if prefix_lengths is not None else None
        for key, pattern, layer in zip(self.mask_keys, self.patterns, range(self.n_layers)):
            if key in ctx.biases or key in skip:
                continue
            if pattern == "full" and bias is None and prefix is None:
                ctx.padding_only[key] = self.causal  # unpadded batches may attend sequence by sequence
            ctx.biases[key] = self._mask_bias(ctx, pattern, layer, bias, prefix, x.dtype)
        if self.rotary is not None:
            ctx.rope = self.rotary(position_ids)
        return ctx

    def _global_tokens(self, global_tokens, batch: int, length: int, device):
        """(B, T) bool Longformer global tokens: as given (a 0/1 mask as the reference takes it), or
        the config's default where a layer's pattern needs them."""
        if global_tokens is not None:
            return global_tokens.bool()
        if "longformer" in self.patterns:
            return default_global_tokens(self.cfg, batch, length, device)
        return None

    def _mask_bias(self, ctx: AttentionContext, pattern: str, layer: int, bias, prefix, dtype):
        """One mask's additive bias (B|1, H|1, Tq, Tk), or None: the pattern (or prefix) and padding
        as a mask, plus the stack's position bias and the pattern's own."""
        allowed = pattern_mask(self.cfg, pattern, ctx.q_pos, ctx.k_pos, self.causal, ctx.global_tokens, layer)
        if prefix is not None:
            allowed = allowed | prefix
        if ctx.key_padding is not None and pattern != "linformer":  # Linformer keys are projections
            padding = ctx.key_padding[:, None, None, :]
            allowed = padding if allowed is None else allowed & padding
        if allowed is not None and not torch.compiler.is_compiling() and bool(allowed.all()):
            # every key visible (no padding, a decoding step): SDPA's unmasked kernel; a compiled
            # graph keeps the mask rather than read it back (same result, no graph break)
            allowed = None
        extra = pattern_bias(self.cfg, pattern, ctx.q_pos, ctx.k_pos, layer)
        layer_bias = bias if extra is None else extra if bias is None else bias + extra
        return additive(allowed, layer_bias, dtype)

    def _prefix(self, k_pos, prefix_lengths, batch: int) -> torch.Tensor:
        """(B, 1, 1, Tk) keys in each example's prefix, after checking the request makes sense."""
        if not self.causal or set(self.patterns) != {"full"}:
            # a window's prefix would need its own bidirectional band: not defined here
            raise ValueError("prefix_lengths needs a causal stack with full attention, got "
                             f"{'causal' if self.causal else 'bidirectional'} {sorted(set(self.patterns))}")
        if tuple(prefix_lengths.shape) != (batch,) or prefix_lengths.is_floating_point():
            raise ValueError(f"prefix_lengths must be an integer tensor of shape ({batch},), "
                             f"got {tuple(prefix_lengths.shape)}")
        return prefix_keys(k_pos, prefix_lengths.to(k_pos.device))

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
