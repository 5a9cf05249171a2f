"""Physical head pruning (Michel et al. 2019, sec. 5): a pruned head's rows of the q, k, v
projections and its columns of the output projection are removed, so the model is smaller and
faster, not merely masked.

Heads are named by attention and layer ("encoder.3", "decoder.0", "cross.1") and by their index
in the unpruned model; the config's `pruned_heads` records what is gone, so a saved model reloads
with each layer's own head count. Models whose position scheme has per-head terms (T5, ALiBi,
XL), GQA/MQA and ALBERT's shared layers refuse (the config names why): masks work there.
"""
from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.model import Transformer


def attention_module(model: Transformer, key: str) -> nn.Module:
    """The Attention of "encoder.L", "decoder.L" (self-attention) or "cross.L"."""
    attention, _, layer = key.partition(".")
    stack = getattr(model, "decoder" if attention == "cross" else attention, None)
    if (stack is None or not hasattr(stack, "blocks") or not layer.isdigit()
            or int(layer) >= len(stack.blocks)):
        raise ValueError(f"no attention {key!r} in this {model.config.architecture} model")
    block = stack.blocks[int(layer)]
    return block.cross_attn if attention == "cross" else block.attn


def attention_keys(cfg: ModelConfig) -> list:
    """Every attention of the architecture, e.g. ["encoder.0", ..., "cross.5"]."""
    if cfg.architecture == "encoder-decoder":
        return ([f"encoder.{i}" for i in range(cfg.n_layers)]
                + [f"decoder.{i}" for i in range(cfg.decoder_layers)]
                + [f"cross.{i}" for i in range(cfg.decoder_layers)])
    return [f"{cfg.architecture}.{i}" for i in range(cfg.n_layers)]


def kept_heads(cfg: ModelConfig, key: str) -> list:
    """Original indices of the heads `key` still has."""
    gone = set((cfg.pruned_heads or {}).get(key, ()))
    return [h for h in range(cfg.n_heads) if h not in gone]


def _rows(heads: list, dh: int, parts: int, width: int) -> torch.Tensor:
    """Rows of a projection holding `parts` blocks of width rows (q | k | v) for the given heads."""
    per_part = torch.cat([torch.arange(h * dh, (h + 1) * dh) for h in heads])
    return torch.cat([per_part + p * width for p in range(parts)])


def sliced_linear(linear: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A new Linear keeping `index` of its outputs (dim 0) or inputs (dim 1)."""
    weight = linear.weight.detach().index_select(dim, index.to(linear.weight.device))
    bias = linear.bias
    if bias is not None and dim == 0:
        bias = bias.detach().index_select(0, index.to(bias.device))
    new = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                    device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        if bias is not None:
            new.bias.copy_(bias)
    return new.train(linear.training)


def _shrink(attn: nn.Module, keep: list) -> None:
    """Keep heads at positions `keep` (of the module's current heads)."""
    dh, H = attn.dh, attn.n_heads
    if attn.cross:
        attn.q = sliced_linear(attn.q, _rows(keep, dh, 1, H * dh), 0)
        attn.kv = sliced_linear(attn.kv, _rows(keep, dh, 2, H * dh), 0)
    else:
        attn.qkv = sliced_linear(attn.qkv, _rows(keep, dh, 3, H * dh), 0)
        if hasattr(attn, "global_qkv"):  # Longformer's global projections have the same heads
            attn.global_qkv = sliced_linear(attn.global_qkv, _rows(keep, dh, 3, H * dh), 0)
    attn.out = sliced_linear(attn.out, _rows(keep, dh, 1, H * dh), 1)
    attn.n_heads = attn.n_kv = len(keep)


def prune_heads(model: Transformer, remove: dict) -> Transformer:
    """Remove heads in place: remove maps "encoder.L" / "decoder.L" / "cross.L" to original head
    indices; heads already gone are ignored. Returns the model, its config updated."""
    cfg = model.config
    merged = {k: list(v) for k, v in (cfg.pruned_heads or {}).items()}
    for key, heads in remove.items():
        merged[key] = sorted(set(merged.get(key, [])) | {int(h) for h in heads})
    new_cfg = cfg.replace(pruned_heads={k: v for k, v in merged.items() if v})  # validates: names the problem
    for key, heads in remove.items():
        before = kept_heads(cfg, key)
        after = kept_heads(new_cfg, key)
        if after != before:
            _shrink(attention_module(model, key), [before.index(h) for h in after])
    model.config = new_cfg
    for stack in (getattr(model, "encoder", None), getattr(model, "decoder", None)):
        if hasattr(stack, "cfg"):
            stack.cfg = new_cfg
    return model


def head_counts(cfg: ModelConfig) -> dict:
    """Heads each attention has, by key."""
    return {key: len(kept_heads(cfg, key)) for key in attention_keys(cfg)}
