"""Multi-process training under torchrun: process group, DDP/FSDP wrapping, rank-0 duties.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them the run is one process and
every function here is a no-op. The CPU backend is gloo, CUDA uses nccl.
"""
from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn


def world() -> tuple:
    """(rank, world size) of this process; (0, 1) outside torchrun."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_from_env(device: torch.device) -> tuple:
    """Join the process group that torchrun describes in the environment; (rank, world)."""
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return world()


def wrap(module: nn.Module, parallel: str, device: torch.device) -> nn.Module:
    """The module to train: itself, DistributedDataParallel or FSDP (only under torchrun)."""
    _, size = world()
    if size == 1 or parallel == "none":
        return module
    if parallel == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        # unused parameters: an objective may leave a head idle on a step (e.g. no span sampled)
        return nn.parallel.DistributedDataParallel(module, device_ids=ids, find_unused_parameters=True)
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel(module, device_id=device if device.type == "cuda" else None,
                                    use_orig_params=True)


def no_sync(module: nn.Module, last_micro_batch: bool):
    """Skip the gradient all-reduce on every micro-batch but the last of an optimiser step."""
    if last_micro_batch or not hasattr(module, "no_sync"):
        return contextlib.nullcontext()
    return module.no_sync()


def full_state_dict(module: nn.Module) -> dict:
    """The unsharded state dict (every rank must call this under FSDP)."""
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

    if isinstance(module, FullyShardedDataParallel):
        policy = FullStateDictConfig(offload_to_cpu=True, rank0_only=False)
        with FullyShardedDataParallel.state_dict_type(module, StateDictType.FULL_STATE_DICT, policy):
            return module.state_dict()
    return unwrap(module).state_dict()


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DDP/FSDP wrapper."""
    return getattr(module, "module", module)


def all_mean(value: float, device: torch.device) -> float:
    """The mean of a scalar over every process (for logged metrics)."""
    _, size = world()
    if size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t) / size


def _is_fsdp(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(module, FullyShardedDataParallel)


def optimizer_state(module: nn.Module, optimizer) -> dict:
    """The optimiser state keyed like an unsharded run (every rank must call this under FSDP)."""
    if _is_fsdp(module):
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel.optim_state_dict(module, optimizer)
    return optimizer.state_dict()


def load_optimizer_state(module: nn.Module, optimizer, state: dict) -> None:
    """Load what `optimizer_state` returned (re-sharding it under FSDP)."""
    if _is_fsdp(module):
        from torch.distributed.fsdp import FullyShardedDataParallel

        state = FullyShardedDataParallel.optim_state_dict_to_load(module, optimizer, state)
    optimizer.load_state_dict(state)


def load_full_state_dict(module: nn.Module, state: dict) -> None:
    """Load an unsharded state dict into the (possibly wrapped) module, strictly."""
    if _is_fsdp(module):
        from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

        policy = FullStateDictConfig(offload_to_cpu=True, rank0_only=False)
        with FullyShardedDataParallel.state_dict_type(module, StateDictType.FULL_STATE_DICT, policy):
            module.load_state_dict(state)
        return
    unwrap(module).load_state_dict(state)
