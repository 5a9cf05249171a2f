"""Multi-process training under torchrun: process group, DDP/FSDP wrapping, rank-0 duties.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them the run is one process and
every function here is a no-op. The CPU backend is gloo, CUDA uses nccl.
"""
from __future__ import annotations

import atexit
import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn

from lmforge.utils.errors import OptionsError
from lmforge.utils.ranks import several_ranks


def world() -> tuple:
    """(rank, world size) of this process; (0, 1) outside torchrun."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def refuse_unsynced(parallel: str) -> None:
    """An OptionsError naming parallel where it is none under torchrun with several processes."""
    if parallel == "none" and several_ranks():  # no all-reduce: each rank's copy would go its own way
        raise OptionsError(f"parallel=none under torchrun (WORLD_SIZE={os.environ['WORLD_SIZE']}): each "
                           f"process would train a copy of its own, its gradients never averaged with the "
                           f"others', and rank 0's alone be saved; use parallel=ddp or parallel=fsdp",
                           "parallel")


def process_device(name: str) -> torch.device:
    """The device `name` ('auto': cuda when available, else cpu) stands for in this process: under torchrun
    with several processes, CUDA without an index is the node's LOCAL_RANK-th GPU (each process its own); an
    OptionsError naming device where the node has no GPU for that LOCAL_RANK."""
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)
    if device.type != "cuda" or device.index is not None or not several_ranks():
        return device
    index, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    if index >= count:  # else it would share a GPU another process of the node trains on
        raise OptionsError(f"device={name}: this process is LOCAL_RANK={index} but the machine has {count} "
                           f"CUDA device(s): start at most {count} processes a node (torchrun "
                           f"--nproc_per_node), one a GPU", "device")
    return torch.device("cuda", index)


def resolve_device(name: str) -> torch.device:
    """The run's device (process_device), made the current CUDA device under torchrun with several
    processes: NCCL and anything allocated without a device use this process's GPU, not cuda:0."""
    device = process_device(name)
    if device.type == "cuda" and several_ranks():
        torch.cuda.set_device(device)
    return device


def init_from_env(device: torch.device) -> tuple:
    """Join the process group that torchrun describes in the environment; (rank, world)."""
    if not several_ranks():
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        # a group left to interpreter teardown can abort a rank as gloo's threads are torn down
        # ("terminate called without an active exception", seen once in a clean-clone CI run)
        atexit.register(_shutdown)
    return world()


def _shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(module: nn.Module, parallel: str, device: torch.device) -> nn.Module:
    """The module to train: itself, DistributedDataParallel, or sharded with FSDP2 (under torchrun).

    FSDP shards every transformer block, then the rest (fully_shard, which also runs on CPU
    with gloo)."""
    _, size = world()
    if size == 1:
        return module
    refuse_unsynced(parallel)  # a Trainer built directly (pretrain and finetune refused it before any read)
    if parallel == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        # DDP's search for parameters a step leaves without a gradient (a head idle on a batch, as SpanBERT's
        # with no span) costs a traversal of the autograd graph a step, and warns where it finds none: skipped
        # only where the trained module says each step reaches every one (Objective.uses_every_parameter)
        every = getattr(module, "uses_every_parameter", None)
        unused = not (callable(every) and every())
        return nn.parallel.DistributedDataParallel(module, device_ids=ids, find_unused_parameters=unused)
    from torch.distributed.fsdp import fully_shard

    from lmforge.layers.block import Block

    for sub in module.modules():
        if isinstance(sub, Block):
            fully_shard(sub)
    return fully_shard(module)


@contextlib.contextmanager
def root_gathered(module: nn.Module):
    """Under FSDP, the root's own weights (embeddings, heads, final norm) gathered for the block on every
    rank, which all enter it: an evaluator calls the model by other methods than the root's forward, whose
    hook gathers them in training (each sharded block still gathers its own in its forward). Else nothing."""
    if not hasattr(module, "unshard"):  # one process, or DDP: every weight is whole
        yield
        return
    module.unshard()
    try:
        yield
    finally:
        module.reshard()


def no_sync(module: nn.Module, last_micro_batch: bool):
    """Skip the gradient all-reduce (reduce-scatter under FSDP) on all but the last micro-batch."""
    if hasattr(module, "set_requires_gradient_sync"):  # FSDP2
        module.set_requires_gradient_sync(last_micro_batch)
        return contextlib.nullcontext()
    if last_micro_batch or not hasattr(module, "no_sync"):
        return contextlib.nullcontext()
    return module.no_sync()


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (FSDP2 shards in place)."""
    return getattr(module, "module", module)


def all_mean(value: float, device: torch.device) -> float:
    """The mean of a scalar over every process (for logged metrics)."""
    _, size = world()
    if size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t) / size


def from_root(obj):
    """Rank 0's `obj` (any picklable object) on every process; `obj` itself in one process."""
    if world()[1] == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)  # nccl: through the current device (resolve_device set it)
    return box[0]


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """A device tensor summed over every process (itself in one process)."""
    if world()[1] > 1:
        dist.all_reduce(t)
    return t


def _options(strict: bool = True):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, strict=strict)


def full_state_dict(module: nn.Module) -> dict:
    """The unsharded weights (every rank must call this under FSDP)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(unwrap(module), options=_options())


def model_state(module: nn.Module) -> dict | None:
    """The unsharded weights of the model the objective `module` trains, keyed as the model's own state_dict
    (every rank calls this: FSDP gathers them), for rank 0 to save; None in one process (its own serve)."""
    if world()[1] == 1:
        return None
    full = full_state_dict(module)
    return {k.removeprefix("model."): v for k, v in full.items() if k.startswith("model.")}


def load_full_state_dict(module: nn.Module, state: dict) -> None:
    """Load unsharded weights into the (possibly sharded) module, strictly."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(unwrap(module), state, options=_options())


def optimizer_state(module: nn.Module, optimizer) -> dict:
    """The unsharded optimiser state, keyed by parameter name (every rank calls this)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(unwrap(module), optimizer, options=_options())


def load_optimizer_state(module: nn.Module, optimizer, state: dict) -> None:
    """Load what `optimizer_state` returned (re-sharding it under FSDP)."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    # not strict: a trained parameter that never had a gradient (XLNet's segment bias under PLM, a loaded
    # model's unused head) has no Adam state, in the run as in its checkpoint, and goes on without one;
    # the checkpoint's files are verified by their checksums before this
    pairs = [[k for k, v in group.items() if isinstance(v, tuple)] for group in optimizer.param_groups]
    set_optimizer_state_dict(unwrap(module), optimizer, state, options=_options(strict=False))
    # torch first gives every parameter state by a zero-gradient step (step 1, zero moments): one the
    # checkpoint holds none for drops it again, or its first gradient would be bias-corrected as a second
    names = {id(p): name for name, p in unwrap(module).named_parameters()}
    held = set(state.get("state", {}))
    for group in optimizer.param_groups:
        for param in group["params"]:
            if names.get(id(param)) not in held:
                optimizer.state.pop(param, None)
    # it hands the groups' tuples back as lists (betas): the same numbers, but the resumed run's next
    # checkpoint would then differ, byte for byte, from the one the run straight through writes
    for group, keys in zip(optimizer.param_groups, pairs):
        group.update({k: tuple(group[k]) for k in keys if isinstance(group.get(k), list)})
