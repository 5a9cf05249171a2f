"""Per-thread scratch buffers for outputs that die inside their layer (FastLinear.transient's fused
q, k, v and FFN hidden units; Int8Linear's scaled input): glibc maps outputs of 32 MB and more
afresh at every call and page-faults them at their first write, so they are reused from call to call.
Here, below fast/ and quant/'s int8 layers alike, so neither package imports the other for them.
"""
from __future__ import annotations

import math
import threading

import torch

from lmforge.utils.malloc import preloaded


def pooling_allocator() -> bool:
    """Whether this process's malloc keeps freed large blocks for reuse itself (utils/malloc.py)."""
    return preloaded() is not None


# outputs from this size on go to FastLinear.transient's reused buffers: glibc maps those over its mmap
# threshold (which rises with frees but stops at 32 MB) afresh at every call and page-faults them
# at their first write; smaller ones mostly come back from its free lists. A pooling allocator hands
# them back without faults, and there per-thread buffers grown to each new largest batch only add
# memory (MiniLM, two one-thread encoders, 400 batches of 8-40 texts on tcmalloc: resident 462 ->
# 555 MiB with them, 449 -> 510 / 521 MiB in two runs without; 110.0 vs 111.3 / 108.7 texts/s): none there
SCRATCH_MIN_BYTES = 1 << 62 if pooling_allocator() else 1 << 24
_SCRATCH = threading.local()  # slot -> flat buffer, per thread: concurrent calls never share one


def scratch(slot: str, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """A tensor of `shape` on a buffer this thread reuses for `slot` (grown as needed): its contents
    last until the next request for the same slot."""
    n = math.prod(shape)
    buffers = _SCRATCH.__dict__.setdefault("buffers", {})
    buffer = buffers.get(slot)
    # one made under inference_mode cannot be written outside it (BiEncoder.encode, then a no_grad decode)
    stale = buffer is not None and buffer.is_inference() and not torch.is_inference_mode_enabled()
    if (stale or buffer is None or buffer.numel() < n or buffer.dtype != like.dtype
            or buffer.device != like.device):
        buffer = buffers[slot] = like.new_empty(n)
    return buffer[:n].view(shape)


def release_scratch() -> None:
    """Free this thread's scratch buffers."""
    _SCRATCH.__dict__.pop("buffers", None)
