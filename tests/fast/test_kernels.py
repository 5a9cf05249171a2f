"""The model's forward chooses each mask's attention backend; the layers only call it."""
import pytest
import torch

import lmforge
from lmforge.fast.blocked import ChunkPlan
from lmforge.fast.kernels import BlockedKernel, Jagged, PerSequence, Repadded
from lmforge.fast.optimize import optimize
from lmforge.fast.packing import Packing
from lmforge.fast.paths import FastPaths
from lmforge.layers.attention import DenseKernel
from lmforge.model import StackPass

_BASE = dict(vocab_size=99, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=128, window=8,
             block_size=4)


def _context(model, T, mask=None, packing=None, return_attention=False, dense=False):
    stack = model.decoder if model.config.architecture == "decoder" else model.encoder
    x = torch.zeros(1 if mask is None else mask.shape[0], T, model.config.d_model)
    return model._context(stack, x, torch.arange(T)[None], 0, mask,
                          StackPass(return_attention=return_attention), packing=packing, dense=dense)


def test_windowed_masks_of_long_sequences_run_blocked_and_get_no_dense_mask():
    model = lmforge.build(lmforge.ModelConfig(**_BASE, attention="sliding-window"))
    assert type(_context(model, 100).kernel_for("sliding-window")) is DenseKernel  # plain: dense masks
    optimize(model)
    for T, blocked in ((16, False), (24, False), (25, True), (100, True)):  # band 16 + 4 + 4 = 24 keys
        ctx = _context(model, T)
        assert isinstance(ctx.biases["sliding-window"], ChunkPlan) == blocked
        assert isinstance(ctx.kernel_for("sliding-window"), BlockedKernel) == blocked
    for dense in (dict(return_attention=True), dict(dense=True)):  # attention maps, masks a caller edits
        ctx = _context(model, 100, **dense)
        assert not isinstance(ctx.biases["sliding-window"], ChunkPlan)
        assert not isinstance(ctx.kernel_for("sliding-window"), BlockedKernel)
    assert _context(model, 100, return_attention=True).inspection.wants(0)
    optimize(model, paths=FastPaths(local_attention="dense"))
    assert not isinstance(_context(model, 100).biases["sliding-window"], ChunkPlan)


def test_a_schedule_gets_a_backend_per_mask():
    schedule = ["sliding-window", "full", "dilated"]
    model = optimize(lmforge.build(lmforge.ModelConfig(**{**_BASE, "n_layers": 3},
                                                       attention_schedule=schedule, dilation=2)))
    mask = torch.arange(100)[None] < torch.tensor([[100], [60]])
    packing = Packing(mask, by_sequence=True)
    ctx = _context(model, 100, mask, packing)
    kinds = {key: type(ctx.kernel_for(key)) for key in ("sliding-window", "full", "dilated")}
    assert kinds == {"sliding-window": Repadded, "full": PerSequence, "dilated": Repadded}
    assert isinstance(ctx.kernel_for("dilated").inner, BlockedKernel)
    # cross-attention and any other mask
    assert isinstance(ctx.kernel.inner, DenseKernel) and not isinstance(ctx.kernel.inner, BlockedKernel)


@pytest.mark.parametrize("name, by_sequence", [("bert-base", True), ("llama-3.2-1b", False)])
def test_packed_rows_attend_sequence_by_sequence_only_where_nothing_needs_the_padded_layout(name,
                                                                                            by_sequence):
    model = optimize(lmforge.build(lmforge.tiny(name)))
    mask = torch.arange(10)[None] < torch.tensor([[10], [4]])
    packing = Packing(mask, by_sequence=True)
    # rotary's angles are laid out (B, T): its packed rows are re-padded
    assert isinstance(_context(model, 10, mask, packing).kernel_for("full"), PerSequence) == by_sequence
    assert isinstance(_context(model, 10, mask, packing, return_attention=True).kernel_for("full"), Repadded)
    assert isinstance(_context(model, 10, mask, Packing(mask, by_sequence=False)).kernel_for("full"),
                      Repadded)


def test_bidirectional_padding_masks_attend_as_one_jagged_call_where_asked_and_on_cuda_by_default():
    model = optimize(lmforge.build(lmforge.tiny("bert-base")), paths=FastPaths(jagged_attention="always"))
    mask = torch.arange(10)[None] < torch.tensor([[10], [4]])
    packing = model._packing(mask, None, None)
    assert packing.jagged and isinstance(_context(model, 10, mask, packing).kernel_for("full"), Jagged)
    causal = optimize(lmforge.build(lmforge.tiny("gpt2")),
                      paths=FastPaths(jagged_attention="always", unpad="always"))
    kernel = _context(causal, 10, mask, causal._packing(mask, None, None)).kernel_for("full")
    assert not isinstance(kernel, Jagged)  # the jagged layout has no causal path on the CPU
    assert FastPaths().wants_jagged(torch.device("cuda")) and \
        not FastPaths().wants_jagged(torch.device("cpu"))


def test_kernels_keep_the_layouts_they_promise():
    mask = torch.tensor([[True, True, True], [True, False, False]])
    packing = Packing(mask)
    fused = torch.randn(4, 3 * 8)  # N = 4 real tokens, H = Hkv = 2, dh = 4
    q, k, v = PerSequence(packing, False).heads(fused, 2, 2, 4)
    assert q.shape == (4, 2, 4) and PerSequence(packing, False).merge(q).shape == (4, 8)
    q, k, v = Repadded(packing, DenseKernel()).heads(fused, 2, 2, 4)
    assert q.shape == (2, 2, 3, 4) and torch.equal(q[1, :, 1:], torch.zeros(2, 2, 4))
    assert torch.equal(Repadded(packing, DenseKernel()).merge(q), fused[:, :8])
