"""The training loop's device-side pieces: TF32, pinned copies, activation checkpointing, and the
guards kept on the device so that a CUDA step never waits for the GPU.

A step's loss, gradient norm and metrics stay tensors; whether its loss and its updated weights are
finite is folded into two device integers (the first bad step, or NONE). The host reads them back
in one transfer only where the loop needs numbers: a logged step, an evaluation, a checkpoint and
the last step (Pending.read). A stop therefore still names the first bad step, and nothing
non-finite is ever saved, since every save is preceded by a read.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lmforge.train.checkpoint import all_finite
from lmforge.train.distributed import all_mean, all_sum

NONE = 2 ** 62  # "no bad step yet": the earliest bad step is the minimum (agreed across ranks by MIN)


def use_tf32(device: torch.device, on: bool) -> None:
    """On CUDA, let fp32 matmuls and convolutions use TF32 tensor cores (10-bit mantissa products,
    fp32 sums: the Ampere+ default of most training code); nothing elsewhere."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def to_device(batch: dict, device: torch.device) -> dict:
    """The batch on `device`; to CUDA through pinned memory, so the copy overlaps the running step."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


def finite_flag(params) -> torch.Tensor:
    """A device bool: whether every parameter's sum is finite (NaN and inf propagate through a sum;
    a finite tensor near float range can overflow it, which Pending.read confirms exactly)."""
    floats = [p.detach() for p in params if p.is_floating_point() and p.numel()]
    floats = [t.to_local() if hasattr(t, "to_local") else t for t in floats]  # FSDP: this rank's shard
    if not floats:
        return torch.ones((), dtype=torch.bool)
    return torch.isfinite(torch.stack([t.sum().float() for t in floats])).all()


def step_loss(losses: list, counts: list, params, synced: int) -> torch.Tensor:
    """A step's loss from its micro-batches' mean `losses` and prediction `counts` (Loss.count), after
    dividing the gradients of counted losses (their sums backpropagated) by the predictions of the whole
    step on the `synced` processes whose gradients DDP / FSDP averaged (1: this one's alone): the reference
    Trainer's num_items_in_batch, so micro-batches of 13 and 9 masked tokens weigh each token alike, as
    one batch of both would. The loss is then the mean over those predictions. Uncounted: the mean of the
    micro-batches' means."""
    if any(count is None for count in counts):
        return torch.stack(losses).double().mean()
    n = torch.stack([torch.as_tensor(c).to(losses[0].device) for c in counts]).double()
    summed = torch.stack([(torch.stack(losses).double() * n).sum(), n.sum()])  # (loss sum, predictions)
    summed = all_sum(summed) if synced > 1 else summed  # one collective for both
    total = summed[1].clamp(min=1)
    scale_grads(params, synced / total)  # the synced gradients are a mean over processes already
    return summed[0] / total


@torch.no_grad()
def held_out_metrics(module, batches, device: torch.device, autocast) -> dict:
    """{"eval_loss", "eval_<metric>"}: `module`'s loss and metrics over the held-out `batches` (in eval mode,
    under the `autocast()` context), each batch's weighted by its examples, as the reference Trainer's mean
    over examples (a short last batch counts for its rows alone), then averaged over processes."""
    module.eval()
    totals, rows = {}, 0
    for batch in batches:
        with autocast():
            out = module(to_device(batch, device))
        rows += (n := len(next(iter(batch.values()))))
        for k, v in {"loss": out.loss, **out.metrics}.items():
            totals[k] = totals.get(k, 0.0) + float(v) * n
    return {f"eval_{k}": all_mean(v / rows, device) for k, v in totals.items()}


@torch.no_grad()
def scale_grads(params, scale: torch.Tensor) -> None:
    """Multiply every gradient by the device scalar `scale` in place (no host wait; FSDP: this rank's
    shard)."""
    grads = [p.grad for p in params if p.grad is not None]
    grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    if grads:
        torch._foreach_mul_(grads, scale.to(grads[0].device, grads[0].dtype))


class Pending:
    """The steps since the last read: their guards as device integers, their lrs for the message."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bad_loss = torch.full((), NONE, dtype=torch.long, device=device)
        self.bad_weights = torch.full((), NONE, dtype=torch.long, device=device)
        self.lrs: dict = {}

    def note(self, step: int, loss: torch.Tensor, weights_ok: torch.Tensor, lr: float) -> None:
        """Record step `step` (1-based): its loss and whether its updated weights are finite, without a
        host read (torch.where with a Python scalar copies nothing to the device)."""
        self.bad_loss = torch.where(torch.isfinite(loss), self.bad_loss, torch.clamp(self.bad_loss, max=step))
        weights_ok = weights_ok.to(self.device, non_blocking=True)
        self.bad_weights = torch.where(weights_ok, self.bad_weights, torch.clamp(self.bad_weights, max=step))
        self.lrs[step] = lr

    def read(self, params, world: int) -> tuple:
        """(first step with a non-finite loss or None, first step with non-finite weights or None, its lr),
        in one host read, agreed by every rank; a weight alarm is confirmed by the exact check."""
        flags = torch.stack([self.bad_loss, self.bad_weights])
        if world > 1:
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MIN)
        bad_loss, bad_weights = (None if v == NONE else int(v) for v in flags.tolist())
        if bad_weights is not None and bad_loss is None and all_finite(params):
            bad_weights = None  # finite weights whose sum overflowed: a false alarm
            self.bad_weights.fill_(NONE)
        lr = self.lrs.get(bad_weights, 0.0)
        self.lrs.clear()
        return bad_loss, bad_weights, lr


def read_record(record: dict) -> dict:
    """The record with every tensor turned into a float, in one host read."""
    keys = [k for k, v in record.items() if isinstance(v, torch.Tensor)]
    if not keys:
        return record
    values = torch.stack([record[k].detach().double().reshape(()) for k in keys]).tolist()
    return {**record, **dict(zip(keys, values))}


def _blocks(module: nn.Module) -> list:
    """Every block of every Stack in `module` (an ELMo has none)."""
    from lmforge.layers.stack import Stack  # train <- layers: the dependency points the right way

    return [block for m in module.modules() if isinstance(m, Stack) for block in m.blocks]


def checkpoint_blocks(module: nn.Module) -> list:
    """Activation checkpointing (Chen et al. 2016): each Stack block keeps only its input in the forward
    pass and recomputes its activations in the backward pass. Applied from outside the model (an
    instance attribute over Block.forward, so model.py stays plain); the same dropout masks are drawn
    again (torch's checkpoint restores the RNG state), so gradients equal the plain ones. Returns the
    blocks wrapped, for `uncheckpoint_blocks`."""
    blocks = _blocks(module)
    for block in blocks:
        block.forward = _Checkpointed(type(block).forward.__get__(block))
    return blocks


def uncheckpoint_blocks(blocks: list) -> None:
    """Undo checkpoint_blocks: the blocks run their plain forward again."""
    for block in blocks:
        if isinstance(block.__dict__.get("forward"), _Checkpointed):
            del block.forward


class _Checkpointed:
    """A block's forward under torch.utils.checkpoint while gradients are recorded; plain otherwise."""

    def __init__(self, forward) -> None:
        self.forward = forward

    def __call__(self, x, ctx, layer, mask_key=None, self_attention=None):
        if not torch.is_grad_enabled():
            return self.forward(x, ctx, layer, mask_key, self_attention)
        return checkpoint(self.forward, x, ctx, layer, mask_key, self_attention, use_reentrant=False)
