"""What a model's forward checks of its inputs before reading them: each a one-line ValueError naming
the input, where it would otherwise fail deep inside (an IndexError, a shape error) or read a wrong
value silently (a mask of 2 read as 1)."""
from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.config.checks import pattern_set

MASK_VALUES = {"attention_mask": "0 (padding) and 1 (a token)", "global_tokens": "0 (local) and 1 (global)"}


def check_inputs(cfg: ModelConfig, input_ids: torch.Tensor, attention_mask, past: int, name: str,
                 position_ids=None, global_tokens=None) -> None:
    """A ValueError naming the input where a forward's inputs do not fit the model of `cfg` (shape, length,
    mask, Longformer's global tokens, and their values), before they fail deep inside it."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"{name} must be an integer tensor of shape (batch, length), got {shape}")
    B, T = input_ids.shape
    if T == 0:
        raise ValueError(f"{name} is empty: a sequence needs at least one token")
    if past + T > cfg.max_seq_len:
        raise ValueError(f"{name}: {past + T} positions exceed max_seq_len={cfg.max_seq_len}")
    if attention_mask is not None and tuple(attention_mask.shape) != (B, past + T):
        raise ValueError(f"attention mask of shape {tuple(attention_mask.shape)} does not match "
                         f"(batch, cached + new positions) = {(B, past + T)}")
    if global_tokens is not None:
        _check_global(cfg, global_tokens, (B, T))
    if not torch.compiler.is_compiling():  # reading values back would break the graph
        _check_values(cfg, input_ids, attention_mask, position_ids, name, global_tokens)


def _check_global(cfg: ModelConfig, global_tokens, shape: tuple) -> None:
    """Longformer's global_tokens: a (batch, length) tensor, on a model with a longformer layer only."""
    if "longformer" not in pattern_set(cfg):
        raise ValueError(f"global_tokens: this model's attention ({cfg.attention}) has no global "
                         "tokens (Longformer's)")
    if not isinstance(global_tokens, torch.Tensor) or tuple(global_tokens.shape) != shape:
        got = tuple(getattr(global_tokens, "shape", ())) or type(global_tokens).__name__
        raise ValueError(f"global_tokens must be a tensor of shape (batch, length) = {shape}, got {got}")


def _check_values(cfg: ModelConfig, input_ids: torch.Tensor, attention_mask, position_ids, name: str,
                  global_tokens=None) -> None:
    """Token ids inside the vocabulary, masks of 0 and 1 (2 and 0.5 were read as 1; the reference reads
    a global token of 2 as local), positions inside the table (an IndexError there); read back in one
    host sync, as the ids alone were."""
    stats = [input_ids.min(), input_ids.max()]
    masks = {"attention_mask": attention_mask, "global_tokens": global_tokens}
    masks = {k: m for k, m in masks.items() if m is not None and m.dtype != torch.bool}
    for key, mask in masks.items():  # a cache's columns were checked when they were new
        new = mask[:, -input_ids.shape[1]:]
        stats.append(((new != 0) & (new != 1)).any())
    # a table's rows only: learned ones from -position_offset (RoBERTa's padding row), sinusoids from 0
    lowest = {"learned": -cfg.position_offset, "sinusoidal": 0}.get(cfg.position)
    if lowest is None:
        position_ids = None  # rotary, ALiBi, relative biases: computed for any position
    if position_ids is not None:
        stats += [position_ids.min(), position_ids.max()]
    values = torch.stack([v.to(input_ids.device, torch.long) for v in stats]).tolist()
    low, high, limit = values[0], values[1], cfg.vocab_size
    if low < 0 or high >= limit:
        raise ValueError(f"{name} holds token id {low if low < 0 else high} outside the vocabulary "
                         f"[0, {limit})")
    for key, bad in zip(masks, values[2:]):
        if bad:
            raise ValueError(f"{key} must hold {MASK_VALUES[key]} only")
    if position_ids is not None and not lowest <= values[-2] <= values[-1] < cfg.max_seq_len:
        raise ValueError(f"position_ids must be in [{lowest}, max_seq_len={cfg.max_seq_len})")


TWO_STREAM_INPUTS = ("perm_mask", "target_mapping", "mems", "mem_len")
REFUSED = {False: dict.fromkeys(TWO_STREAM_INPUTS, "two-stream inputs need position='xl-relative' (XLNet)"),
           True: {"input_mask": "pass attention_mask instead (it is 1 - input_mask)",
                  "head_mask": "gate heads with lmforge.layers.inspection.inspecting(model, gates=...)",
                  "position_ids": "XLNet's positions are relative, counted from its memory: it takes none",
                  "global_tokens": "XLNet has no global attention (Longformer's)"}}


def refuse_inputs(model: nn.Module, args: tuple, kwargs: dict) -> None:
    """Encoders' forward pre-hook: an input it does not take (XLNet's on another encoder, the reference
    XLNetModel's that XLNet does without) is an error naming it and what to pass, not a TypeError."""
    refused = REFUSED[model.config.position == "xl-relative"]  # REFUSED[is XLNet]: name -> what to pass
    given = [name for name in refused if name in kwargs]
    if given:
        raise ValueError(f"{given[0]}: {refused[given[0]]}")
