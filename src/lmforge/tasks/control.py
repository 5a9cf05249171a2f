"""What a fine-tuning run trains, and how fast: freezing and layer-wise learning-rate decay.

Depth counts from the input: the embeddings (token table, positions, segments) are depth 0,
the blocks 1..L in the order the input meets them (an encoder-decoder's encoder, then its
decoder), and everything above them (final norms, heads) depth L + 1.

- Freezing (Peters et al. 2018's feature-based use, and the partial freezing of Howard &
  Ruder 2018): the embeddings, the first k blocks, or everything but the head. Frozen
  weights get requires_grad=False, so they get no gradient and no optimiser state.
- Layer-wise learning-rate decay (Howard & Ruder 2018's discriminative fine-tuning; Clark
  et al. 2020, ELECTRA app. A): depth d trains at lr x decay^(L + 1 - d), so the head and
  final norms train at lr, the top block at lr x decay, the embeddings at lr x decay^(L+1).
"""
from __future__ import annotations

import re

from torch import nn

BLOCK = re.compile(r"^(encoder|decoder)\.blocks\.(\d+)\.")
EMBEDDINGS = re.compile(r"^(tokens|embed|encoder_embed|decoder_embed)\.")


def n_blocks(model: nn.Module) -> int:
    """Blocks of the model, encoder and decoder together (what depth L counts)."""
    return sum(len(getattr(model, stack).blocks) for stack in ("encoder", "decoder") if hasattr(model, stack))


def depth(model: nn.Module, name: str) -> int:
    """Depth of a parameter of `model` by its name (see the module docstring)."""
    if EMBEDDINGS.match(name):
        return 0
    block = BLOCK.match(name)
    if block is None:
        return n_blocks(model) + 1
    offset = len(model.encoder.blocks) if block[1] == "decoder" and hasattr(model, "encoder") else 0
    return offset + int(block[2]) + 1


def trainable_count(model: nn.Module) -> int:
    """The parameters (elements) an optimiser would train: those that require a gradient."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def freeze(model: nn.Module, embeddings: bool = False, layers: int = 0, backbone: bool = False) -> int:
    """Stop training the embeddings, the first `layers` blocks, or (backbone) everything but the
    heads; returns the number of frozen parameters (elements)."""
    if layers and model.config.share_layers:
        raise ValueError("freeze_layers: the blocks of this model share their weights (share_layers)")
    if layers > n_blocks(model):
        raise ValueError(f"freeze_layers={layers} but the model has {n_blocks(model)} blocks")
    frozen = 0
    for name, param in model.named_parameters():
        d = depth(model, name)
        if (backbone and not name.startswith("heads.")) or (embeddings and d == 0) or 1 <= d <= layers:
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def lr_scales(model: nn.Module, decay: float) -> dict:
    """id(parameter) -> learning-rate factor decay^(L + 1 - depth)."""
    if not 0.0 < decay <= 1.0:
        raise ValueError(f"layer_decay must be in (0, 1], got {decay}")
    top = n_blocks(model) + 1
    return {id(p): decay ** (top - depth(model, name)) for name, p in model.named_parameters()}


def lr_scale_fn(model: nn.Module, decay: float):
    """The `lr_scale(name, param)` callable of Trainer / optim.param_groups (None for no decay);
    parameters outside `model` (an objective's own) train at the full rate."""
    if decay == 1.0:
        return None
    scales = lr_scales(model, decay)
    return lambda name, param: scales.get(id(param), 1.0)
