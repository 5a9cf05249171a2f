"""TrainConfig: every knob of the one training loop, validated on creation."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from lmforge.train.optim import SCHEDULES

PRECISIONS = ("fp32", "bf16")
PARALLEL = ("none", "ddp", "fsdp")


@dataclass
class TrainConfig:
    """How to train: batch, optimiser, schedule, precision, evaluation, checkpoints, logging."""

    steps: int = 1000  # optimiser steps
    batch_size: int = 32  # examples per micro-batch per process
    accumulation: int = 1  # micro-batches per optimiser step (global batch = batch_size x accumulation x world)
    lr: float = 1e-4
    weight_decay: float = 0.01
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-6
    warmup: int = 100  # steps of linear warm-up
    schedule: str = "linear"  # decay after warm-up: linear | cosine | constant
    min_lr_ratio: float = 0.0
    clip: Optional[float] = 1.0  # global gradient-norm clipping; None: off
    precision: str = "fp32"  # bf16: autocast on CPU and GPU (weights and optimiser stay fp32)
    compile: bool = False  # torch.compile the objective (model + heads): same results, slow first steps
    seed: int = 0
    eval_every: int = 0  # 0: no evaluation during training
    eval_batches: int = 8
    log_every: int = 10
    save_every: int = 0  # 0: only the final checkpoint
    keep_last: int = 2  # checkpoints kept on disk
    parallel: str = "none"  # none | ddp | fsdp (under torchrun)
    device: str = "auto"  # auto: cuda when available, else cpu
    progress: bool = True

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        for name in ("steps", "batch_size", "accumulation", "log_every", "keep_last", "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup", "eval_every", "save_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for name, choices in (("schedule", SCHEDULES), ("precision", PRECISIONS), ("parallel", PARALLEL)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}={getattr(self, name)!r} is not one of {', '.join(choices)}")

    def to_dict(self) -> dict:
        """Plain JSON-able dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        """Build from a dict; an unknown key is an error naming it."""
        return options_from_dict(cls, data, "training")


def options_from_dict(cls, data: dict, what: str):
    """The options dataclass `cls` from a dict (numbers as their fields' types); an unknown key is an
    error naming it and the known ones."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {what} option(s) {unknown}; known: {', '.join(sorted(known))}")
    return cls(**{k: _typed(cls, k, v) for k, v in data.items()})


def _typed(cls, name: str, value):
    """A value of a numeric field as its type (3.0 -> 3 for ints); an error naming the field if it is not one."""
    kind = {f.name: f.type for f in dataclasses.fields(cls)}[name]
    want = int if kind in ("int", "Optional[int]") else float if kind in ("float", "Optional[float]") else None
    if want is None or value is None or isinstance(value, bool):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if want is int and number != int(number):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return int(number) if want is int else number
