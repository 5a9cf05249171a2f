"""A module in eval mode for a block of work, then back in its own mode."""
from __future__ import annotations

from contextlib import contextmanager

from torch import nn


@contextmanager
def evaluating(module: nn.Module):
    """`module` in eval mode (no dropout) inside the block, and in the mode it had after it, an error
    included: a model scored or probed in the middle of training goes on training."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)
