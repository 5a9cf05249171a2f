"""Structured pruning of feed-forward neurons: the matrices shrink, so the speed-up is real.

A hidden unit i of a layer's FFN gets a gate xi_i on its activation (as heads do in Michel et
al. 2019); its importance is I_i = E |dL/dxi_i| at xi = 1, the first-order estimate of the loss
change when the unit is removed (Molchanov et al. 2017). Each layer keeps its most important
(1 - sparsity) share of units; their rows of W1 (and V, gated variants) and columns of W2 stay,
and the config's `ffn_sizes` records each layer's width so the saved model reloads.
"""
from __future__ import annotations

import torch
from torch import nn

from lmforge.compress.head_pruning import sliced_linear
from lmforge.compress.sparsity import refuse_int8
from lmforge.layers.feedforward import FeedForward
from lmforge.model import Transformer
from lmforge.utils.modes import evaluating


def ffn_modules(model: Transformer) -> dict:
    """"encoder.L" / "decoder.L" -> that layer's FeedForward."""
    out = {}
    for name in ("encoder", "decoder"):
        stack = getattr(model, name, None)
        if stack is not None and hasattr(stack, "blocks"):
            prefix = "decoder" if stack.causal else "encoder"
            out.update({f"{prefix}.{i}": block.ffn for i, block in enumerate(stack.blocks)})
    return out


def ffn_importance(task, examples: list, batch_size: int = 32) -> dict:
    """"encoder.L" -> (d_ff_L,) mean over batches of |dL/dxi_i| for each hidden unit."""
    modules = ffn_modules(task.model)
    device = task.device  # the gates beside the weights (on a GPU too); the importances return on the CPU
    gates = {key: torch.ones(m.down.in_features, device=device, requires_grad=True)
             for key, m in modules.items()}
    totals = {key: torch.zeros(m.down.in_features, device=device) for key, m in modules.items()}
    # the gate multiplies the hidden units on their way into W2: the down projection's input
    hooks = [m.down.register_forward_pre_hook(lambda mod, args, g=gates[key]:
                                              (args[0] * g.to(args[0].dtype),))
             for key, m in modules.items()]
    n = 0
    try:
        with evaluating(task):
            for start in range(0, len(examples), batch_size):
                rows = task.collate(examples[start:start + batch_size])
                batch = {k: v.to(task.device) for k, v in rows.items()}
                task.forward(batch).loss.backward()
                for key, g in gates.items():
                    totals[key] += g.grad.abs()
                    g.grad = None
                n += 1
    finally:
        for h in hooks:
            h.remove()
        task.model.zero_grad(set_to_none=True)
    return {key: (t / max(n, 1)).cpu() for key, t in totals.items()}


def units_kept(width: int, sparsity: float) -> int:
    """Hidden units a layer of `width` keeps at `sparsity`: whole units, at least one."""
    return max(1, round(width * (1 - sparsity)))


def widths(model: Transformer) -> dict:
    """"encoder.L" -> that layer's number of FFN hidden units."""
    return {key: ffn.down.in_features for key, ffn in ffn_modules(model).items()}


def _shrink(ffn: FeedForward, keep: torch.Tensor) -> None:
    """Keep hidden units `keep` (sorted indices) of one FFN."""
    ffn.up = sliced_linear(ffn.up, keep, 0)
    if ffn.gate is not None:
        ffn.gate = sliced_linear(ffn.gate, keep, 0)
    ffn.down = sliced_linear(ffn.down, keep, 1)


def prune_ffn(model: Transformer, importance: dict, sparsity: float) -> dict:
    """Remove the least important `sparsity` share of each layer's hidden units in place;
    returns "encoder.L" -> units kept. The config's ffn_sizes records the new widths."""
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity={sparsity!r} must be in [0, 1): the share of hidden units removed")
    refuse_int8(model)
    modules = ffn_modules(model)
    if set(importance) != set(modules):
        raise ValueError(f"importance covers {sorted(importance)}, the model has {sorted(modules)}")
    keep = {key: importance[key].topk(units_kept(ffn.down.in_features, sparsity)).indices.sort().values
            for key, ffn in modules.items()}
    sizes = {key: len(kept) for key, kept in keep.items()}
    # the config first: one that refuses the widths (ALBERT's shared layers) leaves the model untouched
    config = model.config.replace(ffn_sizes={**(model.config.ffn_sizes or {}), **sizes})
    for key, ffn in modules.items():
        if sizes[key] < ffn.down.in_features:
            _shrink(ffn, keep[key])
    model.config = config
    for stack in (getattr(model, "encoder", None), getattr(model, "decoder", None)):
        if isinstance(stack, nn.Module) and hasattr(stack, "cfg"):
            stack.cfg = model.config
    return sizes
