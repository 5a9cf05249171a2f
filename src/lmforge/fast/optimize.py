"""`lmforge.optimize(model)`: the accelerations turned on once, explicitly, and off again.

The model's layers are plain PyTorch (nn.Linear, nn.Dropout, `x + dropout(h)`, `act(W1 x)`) and its
forward runs the plain way (padded batches, dense SDPA). `optimize(model)` does two things, once:
it gives the model the fast execution (fast/execution.py: unpadding, blocked local attention), and
it turns each of those modules into a subclass with the same parameters and state-dict names whose
forward takes a cheaper route where it is measured to pay (bench/FINDINGS.md), exact but where said:

- FastLinear: in eager fp32 CPU inference the product is oneDNN's linear (4-18 % faster than MKL's
  sgemm on the bench's shapes on Zen 4, ~2.2x on Zen 5, 1.6-2.8x on a decoding step's rows; on a packed
  copy of the weight where they are frozen, FastPaths.frozen()), an FFN's activation inside the same
  call; without it, the bias is
  added after the matmul (addmm copies it into every row first) and the fused q, k, v and the FFN's
  hidden units, outputs that die inside their layer, go into per-thread buffers reused from call to
  call (glibc page-faults fresh large outputs);
- FastDropout: CPU masks drawn as four 16-bit uniforms per 64-bit draw (~4x cheaper);
- FastFeedForward / FastBlock: in inference the activation and the residual sum overwrite the
  fresh tensor they read (an allocation saved per sublayer: bert-mini 210 -> 154 ms a batch), but one
  a forward hook has seen (an analysis may keep it); an FFN between two int8 layers makes its hidden
  units and quantises them in one pass.

Every route has the same results as the plain module (bitwise, or for dropout the same keep
rate, to 2^-16; the int8 FFN's quantised hidden units, but a few in millions one step apart:
quant/int8_ffn.py). Two routes equal theirs within float rounding, not bitwise: the execution's native
attention (fast/native_attention.py; FastPaths(native_attention=False) keeps SDPA) and oneDNN's
linear (FastPaths(onednn_linear=False) keeps F.linear).
`optimize(model, enabled=False)` gives every module its own class and the model
the plain execution back. Nothing is swapped per call and no lock is taken: a forward pass costs the
same whether it runs in one thread or in a server's many. Modules added after `optimize` (a new head)
run plain until `optimize` is called again.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from lmforge.config.options import OptionsError
from lmforge.fast.dropout import FastDropout
from lmforge.fast.execution import FastExecution
from lmforge.fast.linear import IN_PLACE, FastLinear
from lmforge.fast.paths import FastPaths
from lmforge.layers.attention import Attention
from lmforge.layers.block import Block
from lmforge.layers.execution import PLAIN
from lmforge.layers.feedforward import FeedForward
from lmforge.quant.int8_ffn import fused_feedforward
from lmforge.utils.hooks import hooked
from lmforge.utils.errors import shown


def activate(act, h: torch.Tensor, producer: nn.Module | None = None) -> torch.Tensor:
    """act(h), in place when nothing needs h for a backward pass (h is a fresh projection output) and
    no forward hook of `producer`, the module that made h, has seen it (a hook keeping it, an
    analysis, would hold the overwritten values)."""
    if h.requires_grad or act not in IN_PLACE or hooked(producer, pre=False):
        return act(h)
    return IN_PLACE[act](h)


def add_residual(h: torch.Tensor, x: torch.Tensor, *producers: nn.Module) -> torch.Tensor:
    """x + h for a sublayer's fresh output h: into h when no backward pass needs it, the sum has h's
    dtype and shape (under autocast h is bf16 and x + h fp32: into h, the residual stream was rounded
    to bf16) and no forward hook in `producers` (the modules h may come from) has seen it (float
    addition commutes: equal sums)."""
    if h.requires_grad or x.requires_grad or h.dtype != x.dtype or h.shape != x.shape \
            or hooked(*producers, pre=False):
        return x + h
    return h.add_(x)


class FastFeedForward(FeedForward):
    """FeedForward whose activation overwrites the fresh hidden units in inference; between two int8
    layers, made and quantised for the second in one pass (quant/int8_ffn.py)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d_model)
        fused = fused_feedforward(self, x)
        return super().forward(x) if fused is None else fused

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """act(W1 x) (or the gated form), the activation inside oneDNN's product or in place."""
        if self.gate is None:
            fused = self.up.activated(x, self.act) if type(self.up) is FastLinear else None
            return activate(self.act, self.up(x), self.up) if fused is None else fused
        return activate(self.act, self.gate(x), self.gate) * self.up(x)


class FastBlock(Block):
    """Block whose residual sum overwrites the sublayer's fresh output in inference."""

    def _add(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        # skipping the dropout module's call in eval saves ~20 us a sublayer in a decoding step
        return add_residual(self.dropout(h) if self.training and self.dropout.p else h, x, *self._producers())

    def _producers(self) -> tuple:
        """The modules whose output h may be: a sublayer, its output projection (XLNet's query stream
        calls attn.out itself), the dropout. A few attribute reads, where walking the block's modules
        at every residual sum cost ~7 us (a decoding step meets two a layer)."""
        attn, cross, ffn = self.attn, self.cross_attn, self.ffn
        return (attn, attn.out, cross, cross and cross.out, ffn, ffn.down, self.dropout)


# exact class -> its accelerated subclass (exact: a user's own subclass keeps its forward)
SWAPS = {nn.Linear: FastLinear, nn.Dropout: FastDropout, Block: FastBlock, FeedForward: FastFeedForward}
PLAIN_OF = {fast: plain for plain, fast in SWAPS.items()}


def _slots(model: nn.Module) -> list:
    """(linear, slot) of the projections whose outputs die inside their layer: the fused q, k, v
    (KVCache copies what it keeps) and the FFN's hidden units, which reuse per-thread buffers."""
    slots = []
    for module in model.modules():
        if isinstance(module, Attention) and isinstance(getattr(module, "qkv", None), nn.Linear):
            slots.append((module.qkv, "attn.qkv"))
        elif isinstance(module, FeedForward):
            slots += ([(module.up, "ffn.up")]
                      + ([(module.gate, "ffn.gate")] if module.gate is not None else []))
    return slots


def optimize(model: nn.Module, enabled: bool = True, paths: FastPaths | None = None) -> nn.Module:
    """Turn `model`'s accelerations on (enabled=False: off), once; returns the model. paths: which
    execution choices to make (fast/paths.py; default: every one that is measured to pay)."""
    if not isinstance(model, nn.Module):
        raise OptionsError(f"optimize takes a model (a torch.nn.Module), got {type(model).__name__}", "model")
    if not isinstance(enabled, bool):  # "no" would switch everything on
        raise OptionsError(f"enabled must be true or false, got {shown(enabled)}", "enabled")
    if paths is not None and not isinstance(paths, FastPaths):
        raise OptionsError(f"paths must be a FastPaths, got {type(paths).__name__}", "paths")
    if not enabled:
        for module in model.modules():
            if type(module) is FastLinear:  # what optimize set on it; another module's own are its own
                for name in ("slot", "onednn", "small_plain", "packs", "_packed"):
                    module.__dict__.pop(name, None)
            if type(module) in PLAIN_OF:
                module.__class__ = PLAIN_OF[type(module)]
        _set_execution(model, PLAIN)
        return model
    paths = paths or FastPaths()
    if paths.accelerate:
        for module in model.modules():
            if type(module) in SWAPS:
                module.__class__ = SWAPS[type(module)]
        for linear, slot in _slots(model):
            if type(linear) is FastLinear:
                linear.slot = slot
    for module in model.modules():  # also where an earlier optimize left its layers fast
        if type(module) is FastLinear:
            module.onednn, module.small_plain = paths.onednn_linear, paths.small_calls_plain
            module.packs = paths.packed_weights
            module.__dict__.pop("_packed", None)  # packed again at its next call, if still asked
    _set_execution(model, FastExecution(paths))
    return model


def _set_execution(model: nn.Module, execution) -> None:
    for module in model.modules():  # a model inside another (ELECTRA's generator, a teacher) too
        if hasattr(module, "execution"):
            module.execution = execution


def optimized(model: nn.Module) -> bool:
    """Whether `optimize` has turned `model`'s accelerations on."""
    return (getattr(model, "execution", PLAIN).name != "plain"
            or any(type(m) in PLAIN_OF for m in model.modules()))


@contextmanager
def optimized_for(model: nn.Module, enabled: bool = True):
    """`optimize(model)` inside the block, undone after, for a model that was plain (a one-off run
    such as a benchmark's arm); an already optimized model is left as it is."""
    was = optimized(model)
    if enabled and not was:
        optimize(model)
    try:
        yield model
    finally:
        if enabled and not was:
            optimize(model, enabled=False)
