"""FastLinear: nn.Linear with a leaner CPU inference path (swapped in by lmforge.optimize).

In fp32 CPU inference the product runs as oneDNN's linear (`torch.ops.mkldnn._linear_pointwise`, the
bias inside it), where torch has oneDNN enabled on an x86 CPU with AVX2 or AVX-512 and
`FastPaths(onednn_linear=True)` (the default): F.linear runs MKL's sgemm, which on the AVX-512 EPYC
reaches 164-197 GFLOP/s on MiniLM's and BERT's shapes on two threads, where oneDNN reaches 178-217,
and a decoding step's few rows take 1.6-2.8x less (bench/FINDINGS.md, "oneDNN's linear"); on a Zen 5
EPYC MKL stays at ~195 and oneDNN reaches ~440. Its sums are ordered otherwise: equal to F.linear
within float rounding, not bitwise. With `FastPaths(packed_weights=True)` (`FastPaths.frozen()`, what
the jobs that only run a model use) it reads a copy of the weight in oneDNN's blocked layout, packed at
the first call: 2-5 % on a batch's products, 25-35 % on a text's few rows (bench/FINDINGS.md, "Packed
weights"), for a second copy of each weight it runs. The copy is dropped where the weight may change
(a forward with gradients, a change between train() and eval()) and packed again when the Parameter,
its storage or its version counter has changed; a fused AdamW step or a write through `.data` bumps no
counter (nor an embedding's update seen through a tied weight), hence opt-in.
An FFN's activation can run inside the same call (`activated`). Eager only: a compiled graph keeps
F.linear (Inductor lowers this op only for frozen weights). Without it (flag off, no oneDNN, another
CPU, a graph being compiled or traced):

F.linear with a bias runs addmm: it first copies the bias into every row of a fresh (N, out)
output, then has the matrix product accumulate onto it, which reads that output back. In CPU
inference the product can instead write the fresh output and the bias be added into it while it
is still warm: bert-mini with lengths 8..128 (unpadded, 2168 rows) gains 3-10 % a batch, bert-base
is unchanged within noise (bench/FINDINGS.md). The sum is the same up to where the
bias joins it (bitwise equal on the bench's shapes); autograd, autocast and other devices keep
F.linear.

Outputs that die inside their layer (the fused q, k, v; the FFN's hidden units) can instead go
into per-thread buffers reused from call to call (`FastLinear.transient`; accelerate names
the projections whose outputs are such with a scratch `slot`): glibc maps outputs of
32 MB and more afresh at every call and page-faults them at their first write. Where oneDNN would
run such a large one, the buffer is used where it was measured faster on this machine
(`reuses_buffer`, fast/route.py: on a Xeon, not on an EPYC).
"""
from __future__ import annotations

import weakref
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.fast import route
from lmforge.layers.feedforward import gelu_tanh

# the scratch buffers are quant/'s (its int8 layers share them), so quant never imports fast/
from lmforge.quant.scratch import SCRATCH_MIN_BYTES, pooling_allocator, release_scratch, scratch  # noqa: F401
from lmforge.utils.hooks import hooked
from lmforge.utils.versions import version

# oneDNN's fp32 linear with the bias fused, in this torch build (its CPU wheels have it), on x86 with AVX2
# or AVX-512: measured on an AVX-512 EPYC, and held to AVX2 there (ONEDNN_MAX_CPU_ISA), not on an AVX2-only
# CPU; an ARM or pre-AVX2 build keeps F.linear until measured there
ONEDNN = (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
          and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"))

# below this many rows (a decoding step has one per sequence) the output is small and addmm's
# single call is cheaper than two
MIN_ROWS = 64
# oneDNN's linear costs ~15 us a call before any work; F.linear's cost grows with rows x weight from
# ~3 us: a call of fewer multiply-adds (rows x weight values) keeps F.linear (FastPaths.small_calls_plain).
# Two threads of a Zen 5 EPYC, us F.linear / oneDNN packed: (128 -> 128) 16 rows 10 / 17, 64 rows 22 / 22;
# (256 -> 1024) 1 row 16 / 22, 4 rows 46 / 22; (384 -> 384) 1 row 9 / 17, 4 rows 26 / 18; (768 -> 768)
# 1 row 33 / 29 (bench/FINDINGS.md, "Packed weights")
ONEDNN_MIN_WORK = 1 << 19
# the rows oneDNN is told to pack a weight for: its blocked layout is chosen by the ISA, not by this
# hint (a text's 14 rows run as fast on a weight packed for 2,048: 44 vs 44 us at 384 -> 1152)
PACK_ROWS = 2048
# an activation oneDNN runs inside the product (its post-op): (name, algorithm)
POST_OPS = {F.relu: ("relu", ""), F.gelu: ("gelu", "none"), gelu_tanh: ("gelu", "tanh")}
NO_POST = ("none", "")
# in-place forms, for inference: an activation that overwrites its input allocates nothing (a
# bert-mini batch of 32 x 128 allocates 16 MB per layer for it, bench/FINDINGS.md)
IN_PLACE = {F.relu: torch.relu_, F.gelu: torch.ops.aten.gelu_,
            gelu_tanh: lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
            F.silu: partial(F.silu, inplace=True)}


def cpu_inference(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x W^T runs without autograd or autocast on CPU, in the weight's dtype."""
    return (not torch.is_grad_enabled() and x.device.type == "cpu" and x.dtype == weight.dtype
            and not torch.is_autocast_enabled("cpu"))


def bias_after(x: torch.Tensor, weight: torch.Tensor, bias) -> bool:
    """Whether x W^T + b is computed as a plain matmul plus an in-place bias (see the module doc)."""
    return bias is not None and x.numel() >= MIN_ROWS * x.shape[-1] and cpu_inference(x, weight)


def onednn_applies(x: torch.Tensor, weight: torch.Tensor, bias) -> bool:
    """Whether x W^T + b can run as oneDNN's linear: eager fp32 CPU inference in a torch that has it
    enabled, with at least one input feature and a dense bias (oneDNN reads the bias as contiguous)."""
    tracing = torch.compiler.is_compiling() or torch.jit.is_tracing()
    return (ONEDNN and torch.backends.mkldnn.enabled and x.dtype == torch.float32 and not tracing
            and cpu_inference(x, weight) and weight.shape[-1] > 0 and (bias is None or bias.is_contiguous()))


class FastLinear(nn.Linear):
    """y = x W^T + b (weights and state-dict names as nn.Linear's): oneDNN's linear in fp32 CPU
    inference (on a packed copy of W where `packs`); else the bias after the matmul, and an output named
    by `slot` (one that dies inside its layer) in a reused buffer."""

    slot = None  # set per module by lmforge.optimize for the fused q, k, v and the FFN's hidden units
    onednn = False  # set per module by lmforge.optimize from FastPaths.onednn_linear
    small_plain = True  # set per module by lmforge.optimize from FastPaths.small_calls_plain
    packs = False  # set per module by lmforge.optimize from FastPaths.packed_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        if self.takes_onednn(x):
            # its fresh outputs beat MKL's product into a reused buffer, page faults included, on an EPYC
            # (bert-base 32 x 128: 3.70 vs 3.79 s a batch, bench/FINDINGS.md); where not, measured: route.py
            return self.transient(x, self.slot) if self.reuses_buffer(x) else self.onednn_product(x)
        if torch.is_grad_enabled():  # a step may follow, which a fused optimizer makes without bumping
            self.__dict__.pop("_packed", None)  # W's version counter
        return self.plain(x) if self.slot is None else self.transient(x, self.slot)

    def train(self, mode: bool = True) -> FastLinear:
        """nn.Module.train; a change of mode drops the packed copy (training may follow, or has been);
        eval() on a module in eval mode (generate calls it at every call) keeps it."""
        if mode != self.training:
            self.__dict__.pop("_packed", None)
        return super().train(mode)

    def takes_onednn(self, x: torch.Tensor) -> bool:
        """Whether self(x) runs as oneDNN's linear (asked for, large enough, and applicable)."""
        return self.onednn and not self.small(x) and onednn_applies(x, self.weight, self.bias)

    def small(self, x: torch.Tensor) -> bool:
        """Whether this call is too small to repay oneDNN's set-up (where small_plain asks): under
        ONEDNN_MIN_WORK multiply-adds of rows by weight values."""
        rows = x.numel() // max(x.shape[-1], 1)
        return self.small_plain and rows * self.weight.numel() < ONEDNN_MIN_WORK

    def reuses_buffer(self, x: torch.Tensor, act=None) -> bool:
        """Whether self(x) (then the activation `act`, one of POST_OPS, or none), where oneDNN would run it,
        goes into its slot's reused buffer instead: an output that dies in its layer, large enough to be
        mapped afresh at every call, no hook watching (transient gives it a fresh tensor), where that route
        was measured faster on this machine (fast/route.py), each route timed with all it does."""
        if self.slot is None or hooked(self) or not route.mapped_afresh(x, self.out_features):
            return False
        post = POST_OPS.get(act, NO_POST)
        calls = {"onednn": lambda: self.onednn_product(x, post),
                 "scratch": lambda: self.in_buffer(x, act)}
        return route.route(x, self.out_features, calls, (post[0], self.packs)) == "scratch"

    def in_buffer(self, x: torch.Tensor, act=None) -> torch.Tensor:
        """act(self(x)) by MKL into the slot's reused buffer (transient), the activation in place."""
        out = self.transient(x, self.slot)
        return out if act is None else IN_PLACE[act](out)

    def onednn_product(self, x: torch.Tensor, post: tuple = NO_POST) -> torch.Tensor:
        """oneDNN's x W^T + b, then the post-op `post` (name, algorithm) inside the same call."""
        weight = self.packed_weight() if self.packs else self.weight
        return torch.ops.mkldnn._linear_pointwise(x, weight, self.bias, post[0], [], post[1])

    def packed_weight(self) -> torch.Tensor:
        """W in oneDNN's blocked layout: packed at the first call and again after W changed (an optimizer
        step, load_state_dict, a new Parameter). A weight it cannot follow is read as it is: an inference
        tensor (its changes leave no version) or a computed one (a parametrization, e.g. a pruning mask)."""
        weight = self.weight
        current = version(weight)
        if current is None or type(weight) is not nn.Parameter:  # a parametrization computes a plain tensor
            return weight
        key = (weight.data_ptr(), current)
        cached = self.__dict__.get("_packed")  # one read: another thread may replace it meanwhile
        # the Parameter itself too: a new one may sit at a freed one's address with the same version
        if cached is None or cached[0] != key or cached[1]() is not weight:
            cached = (key, weakref.ref(weight),
                      torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS))
            self.__dict__["_packed"] = cached
        return cached[2]

    def activated(self, x: torch.Tensor, act):
        """act(self(x)) with the activation inside oneDNN's call, where self(x) runs there, oneDNN has the
        activation (POST_OPS) and no forward hook watches this module (it would see the product before
        the activation); else None. A large output that dies in its layer may go to its buffer instead,
        the activation then in place (reuses_buffer)."""
        post = POST_OPS.get(act)
        if post is None or hooked(self) or not self.takes_onednn(x):
            return None
        if self.reuses_buffer(x, act):  # MKL into the buffer, then the activation in place
            return self.in_buffer(x, act)
        return self.onednn_product(x, post)

    def __getstate__(self) -> dict:
        """The module's state without the packed copy (oneDNN's opaque tensor neither pickles nor needs
        to: it is packed again at the next call)."""
        state = super().__getstate__()  # nn.Module's: a copy of __dict__
        state.pop("_packed", None)
        return state

    def plain(self, x: torch.Tensor) -> torch.Tensor:
        """The output without the scratch buffer."""
        if bias_after(x, self.weight, self.bias):
            return torch.matmul(x, self.weight.t()).add_(self.bias)
        return F.linear(x, self.weight, self.bias)

    def transient(self, x: torch.Tensor, slot: str) -> torch.Tensor:
        """self(x) for an output that dies inside its layer (the FFN's hidden units, the fused q, k, v):
        in CPU inference a large one is written into a reused per-thread buffer (`scratch`), valid
        until this slot's next use. bert-base 32 x 128: 3.15 vs 3.59 s a batch (bench/FINDINGS.md).
        Where hooks watch the module (they run around forward, so they would see the buffer), the
        output is a fresh tensor."""
        shape = (*x.shape[:-1], self.out_features)
        # the size first: the cheapest test, and the one a small call (decoding, one text) fails
        if (x.numel() // max(x.shape[-1], 1) * self.out_features * x.element_size() < SCRATCH_MIN_BYTES
                or not cpu_inference(x, self.weight) or hooked(self)):
            return self.plain(x)
        out = torch.matmul(x, self.weight.t(), out=scratch(slot, shape, x))
        return out if self.bias is None else out.add_(self.bias)
