"""A module in eval mode for a block of work, then back in its own mode."""
from __future__ import annotations

from contextlib import contextmanager

from torch import nn


@contextmanager
def evaluating(module: nn.Module):
    """`module` in eval mode (no dropout) inside the block, and in the mode it had after it, an error
    included: a model scored or probed in the middle of training goes on training."""
    if not any(m.training for m in module.modules()):  # already: setting it twice walks every module
        yield module  # with nn.Module's __setattr__, 1.2 ms of a 10 ms one-text encode (bench/FINDINGS.md)
        return
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)
