"""CPU accelerations, applied explicitly and reversibly: `with accelerate(model): ...`.

The model's layers are plain PyTorch (nn.Linear, nn.Dropout, `x + dropout(h)`, `act(W1 x)`).
Inside `accelerate(model)` each of those modules runs as a subclass with the same parameters
and state-dict names whose forward takes a cheaper route where it is exact and measured to pay
(bench/FINDINGS.md):

- FastLinear: in CPU inference the bias is added after the matmul (addmm copies it into every
  row first); the fused q, k, v and the FFN's hidden units, outputs that die inside their layer,
  go into per-thread buffers reused from call to call (glibc page-faults fresh large outputs);
- FastDropout: CPU masks drawn as four 16-bit uniforms per 64-bit draw (~4x cheaper);
- FastFeedForward / FastBlock: in inference the activation and the residual sum overwrite the
  fresh tensor they read (an allocation saved per sublayer: bert-mini 210 -> 154 ms a batch); an
  FFN between two int8 layers makes its hidden units and quantises them in one pass.

Every route has the same results as the plain module (bitwise, or for dropout the same keep
rate, to 2^-16; the int8 FFN's quantised hidden units, but a few in millions one step apart:
fast/int8_ffn.py). On exit every module gets its own class back: a model is never left changed.
Re-entrant: a nested `accelerate` of the same model (generate around a forward) does nothing.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.fast.dropout import FastDropout
from lmforge.fast.int8_ffn import fused_feedforward
from lmforge.fast.linear import FastLinear
from lmforge.layers.attention import Attention
from lmforge.layers.block import Block
from lmforge.layers.feedforward import FeedForward, gelu_tanh

# in-place forms, for inference: an activation that overwrites its input allocates nothing (a
# bert-mini batch of 32 x 128 allocates 16 MB per layer for it, bench/FINDINGS.md)
IN_PLACE = {F.relu: torch.relu_, F.gelu: torch.ops.aten.gelu_,
            gelu_tanh: lambda x: torch.ops.aten.gelu_(x, approximate="tanh"), F.silu: partial(F.silu, inplace=True)}


def activate(act, h: torch.Tensor) -> torch.Tensor:
    """act(h), in place when nothing needs h for a backward pass (h is a fresh projection output)."""
    return act(h) if h.requires_grad or act not in IN_PLACE else IN_PLACE[act](h)


def add_residual(h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x + h for a sublayer's fresh output h: into h when no backward pass needs it (float addition
    commutes, so the sums are equal)."""
    return x + h if h.requires_grad or x.requires_grad else h.add_(x)


class FastFeedForward(FeedForward):
    """FeedForward whose activation overwrites the fresh hidden units in inference; between two int8
    layers, made and quantised for the second in one pass (fast/int8_ffn.py)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d_model)
        fused = fused_feedforward(self, x)
        return super().forward(x) if fused is None else fused

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """act(W1 x) (or the gated form), the activation in place."""
        if self.gate is None:
            return activate(self.act, self.up(x))
        return activate(self.act, self.gate(x)) * self.up(x)


class FastBlock(Block):
    """Block whose residual sum overwrites the sublayer's fresh output in inference."""

    def _add(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        # skipping the dropout module's call in eval saves ~20 us a sublayer in a decoding step
        return add_residual(self.dropout(h) if self.training and self.dropout.p else h, x)


# exact class -> its accelerated subclass (exact: a user's own subclass keeps its forward)
SWAPS = {nn.Linear: FastLinear, nn.Dropout: FastDropout, Block: FastBlock, FeedForward: FastFeedForward}


def _plan(model: nn.Module) -> tuple:
    """One pass over the modules: (module, its plain class) for each to swap, and (linear, slot) for
    the projections whose outputs die inside their layer: the fused q, k, v (KVCache copies what it
    keeps) and the FFN's hidden units."""
    swapped, slots = [], []
    for module in model.modules():
        if type(module) in SWAPS:
            swapped.append((module, type(module)))
        if isinstance(module, Attention) and isinstance(getattr(module, "qkv", None), nn.Linear):
            slots.append((module.qkv, "attn.qkv"))
        elif isinstance(module, FeedForward):
            slots += [(module.up, "ffn.up")] + ([(module.gate, "ffn.gate")] if module.gate is not None else [])
    return swapped, slots


_LOCK = threading.Lock()  # guards the entries and exits of every model's acceleration


@contextmanager
def accelerate(model: nn.Module, enabled: bool = True):
    """Run `model`'s plain modules as their accelerated subclasses inside the block; restore them
    after (also on an exception). enabled=False: a no-op, for call sites that choose. Counted, so
    re-entrant and thread-safe: the first entry swaps, the last exit restores (a server's workers
    running one model in two threads never see it restored under a forward pass)."""
    if not enabled:
        yield model
        return
    with _LOCK:
        depth = model.__dict__.get("_accelerated", 0)
        if depth == 0:
            model.__dict__["_acceleration_plan"] = _swap(model)
        model.__dict__["_accelerated"] = depth + 1
    try:
        yield model
    finally:
        with _LOCK:
            model.__dict__["_accelerated"] -= 1
            if model.__dict__["_accelerated"] == 0:
                _restore(*model.__dict__.pop("_acceleration_plan"))
                model.__dict__.pop("_accelerated")


def _swap(model: nn.Module) -> tuple:
    swapped, slots = _plan(model)
    try:
        for module, plain in swapped:
            module.__class__ = SWAPS[plain]
        for linear, slot in slots:
            if type(linear) is FastLinear:
                linear.slot = slot
    except BaseException:  # never leave a model half swapped
        _restore(swapped, slots)
        raise
    return swapped, slots


def _restore(swapped: list, slots: list) -> None:
    for linear, _ in slots:
        linear.__dict__.pop("slot", None)
    for module, plain in swapped:
        module.__class__ = plain


def accelerated(model: nn.Module) -> bool:
    """Whether `model` is inside `accelerate` now."""
    return bool(model.__dict__.get("_accelerated", 0))
