"""A tensor's version counter: every in-place write through the tensor bumps it, so copies derived from a
weight (fast/'s packed weights, int8's packed forms, generation's vocabulary screen) are keyed on it."""
from __future__ import annotations

import torch


def version(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter, or None for an inference tensor (made under inference_mode: it has
    none, and cannot be written in place outside it)."""
    try:
        return tensor._version
    except RuntimeError:
        return None
