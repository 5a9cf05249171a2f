"""Whether forward hooks watch a module. lmforge's faster paths (in-place steps, packed rows, reused
buffers, fused int8 routes) step aside wherever a hook would see other values, or another layout, than
the plain forward shows it: an analysis keeping a layer's output must keep the plain one."""
from __future__ import annotations

from torch.nn.modules import module as _module


def hooked(*modules, pre: bool = True) -> bool:
    """Whether a forward hook (with `pre`, a forward pre-hook too) is registered globally or on one of
    `modules` (None skipped; the modules inside them are not looked at)."""
    if _module._global_forward_hooks or (pre and _module._global_forward_pre_hooks):
        return True
    return any(m is not None and bool(m._forward_hooks or (pre and m._forward_pre_hooks)) for m in modules)
