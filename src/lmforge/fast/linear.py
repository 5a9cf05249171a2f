"""FastLinear: nn.Linear with a leaner CPU inference path (swapped in by fast.accelerate).

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
32 MB and more afresh at every call and page-faults them at their first write.
"""
from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module

from lmforge.fast.malloc import preloaded

# below this many rows (a decoding step has one per sequence) the output is small and addmm's
# single call is cheaper than two
MIN_ROWS = 64


def pooling_allocator() -> bool:
    """Whether this process's malloc keeps freed large blocks for reuse itself (fast/malloc.py)."""
    return preloaded() is not None


# outputs from this size on go to FastLinear.transient's reused buffers: glibc maps those over its mmap
# threshold (which rises with frees but stops at 32 MB) afresh at every call and page-faults them
# at their first write; smaller ones mostly come back from its free lists. A pooling allocator hands
# them back without faults, and there per-thread buffers grown to each new largest batch only add
# memory (MiniLM, two one-thread encoders, 400 batches of 8-40 texts on tcmalloc: resident 462 ->
# 555 MiB with them, 449 -> 510 / 521 MiB in two runs without; 110.0 vs 111.3 / 108.7 texts/s): none there
SCRATCH_MIN_BYTES = 1 << 62 if pooling_allocator() else 1 << 24
_SCRATCH = threading.local()  # slot -> flat buffer, per thread: concurrent calls never share one


def cpu_inference(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x W^T runs without autograd or autocast on CPU, in the weight's dtype."""
    return (not torch.is_grad_enabled() and x.device.type == "cpu" and x.dtype == weight.dtype
            and not torch.is_autocast_enabled("cpu"))


def bias_after(x: torch.Tensor, weight: torch.Tensor, bias) -> bool:
    """Whether x W^T + b is computed as a plain matmul plus an in-place bias (see the module doc)."""
    return bias is not None and cpu_inference(x, weight) and x.numel() >= MIN_ROWS * x.shape[-1]


def scratch(slot: str, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """A tensor of `shape` on a buffer this thread reuses for `slot` (grown as needed): its contents
    last until the next request for the same slot."""
    n = math.prod(shape)
    buffers = _SCRATCH.__dict__.setdefault("buffers", {})
    buffer = buffers.get(slot)
    # one made under inference_mode cannot be written outside it (BiEncoder.encode, then a no_grad decode)
    stale = buffer is not None and buffer.is_inference() and not torch.is_inference_mode_enabled()
    if stale or buffer is None or buffer.numel() < n or buffer.dtype != like.dtype or buffer.device != like.device:
        buffer = buffers[slot] = like.new_empty(n)
    return buffer[:n].view(shape)


def release_scratch() -> None:
    """Free this thread's scratch buffers."""
    _SCRATCH.__dict__.pop("buffers", None)


class FastLinear(nn.Linear):
    """y = x W^T + b (weights and state-dict names as nn.Linear's): the bias after the matmul in CPU
    inference; an output named by `slot` (one that dies inside its layer) goes to a reused buffer."""

    slot = None  # set per module by fast.accelerate for the fused q, k, v and the FFN's hidden units

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        return self.plain(x) if self.slot is None else self.transient(x, self.slot)

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
        if (not cpu_inference(x, self.weight) or self._forward_hooks or self._forward_pre_hooks
                or _module._global_forward_hooks or _module._global_forward_pre_hooks
                or x.numel() // x.shape[-1] * self.out_features * x.element_size() < SCRATCH_MIN_BYTES):
            return self.plain(x)
        out = torch.matmul(x, self.weight.t(), out=scratch(slot, shape, x))
        return out if self.bias is None else out.add_(self.bias)
