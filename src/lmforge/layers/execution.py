"""How a model's forward runs: the plain way, and the slot the speed package fills.

A model holds one `Execution`. The plain one (here) runs every layer on the padded batch with dense
SDPA masks: what a reader of model.py and layers/ sees. `lmforge.optimize(model)` gives the model
another one (lmforge/fast/execution.py) that packs real tokens, runs windowed patterns in query
chunks and draws cheaper dropout masks, with the same results; `optimize(model, enabled=False)`
gives the plain one back. The model itself never imports the speed package.
"""
from __future__ import annotations

from lmforge.layers.attention import DENSE


class Execution:
    """The plain forward: padded batches, dense masks, SDPA (DenseKernel) for every layer."""

    name = "plain"

    def packing(self, model, key_padding, cache, memory, keep_padding: bool, reads_first: bool = False):
        """An object with pack / unpack of the batch's real tokens, or None: keep the padded batch."""
        return None

    def local_layers(self, stack, length: int) -> dict:
        """mask key -> (pattern, first layer) of the masks that run without a dense (T, T) mask."""
        return {}

    def choose_kernels(self, model, stack, ctx, chosen: dict, packing, recording: bool, x) -> None:
        """Set ctx.kernel (and ctx.kernels per mask key): the attention backend of each layer, for the
        stack's input x (B, T, d_model)."""
        ctx.kernel = DENSE
        ctx.kernels = {}


PLAIN = Execution()
