"""TrainConfig: every knob of the one training loop, validated on creation."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

from lmforge.config import option
from lmforge.train.optim import SCHEDULES

PRECISIONS = ("fp32", "bf16")
PARALLEL = ("none", "ddp", "fsdp")
DEFAULT_STEPS = 1000


@dataclass
class TrainConfig:
    """How to train: batch, optimiser, schedule, precision, evaluation, checkpoints, logging."""

    steps: int = option(DEFAULT_STEPS, "optimiser steps (--steps); not with epochs")
    # epochs become steps where the training set's size is known (Trainer): ceil(epochs x examples /
    # examples per step), so a run's trainer.json records the steps it took, not the epochs
    epochs: Optional[float] = option(None, "passes over the training set, instead of steps (e.g. 3 or 0.5)")
    batch_size: int = option(32, "examples per micro-batch per process")
    accumulation: int = option(1, "micro-batches per optimiser step (global batch = batch_size x "
                                  "accumulation x processes)")
    lr: float = option(1e-4, "peak learning rate (AdamW)")
    weight_decay: float = option(0.01, "AdamW's decoupled weight decay (not on biases and norms)")
    betas: tuple = option((0.9, 0.999), "AdamW's (beta1, beta2), each in [0, 1)")
    eps: float = option(1e-6, "AdamW's epsilon")
    warmup: int = option(100, "steps of linear warm-up from 0 to lr")
    schedule: str = option("linear", f"decay after warm-up: {' | '.join(SCHEDULES)}")
    min_lr_ratio: float = option(0.0, "the decay ends at lr x this, in [0, 1]")
    clip: Optional[float] = option(1.0, "global gradient-norm clipping; null (or 0): off")
    precision: str = option("fp32", "fp32, or bf16: autocast on CPU and GPU (weights, optimiser stay fp32)")
    compile: bool = option(False, "torch.compile the objective (model + heads): same results, slow start")
    seed: int = option(0, "seed of everything the run draws (initial weights, data order, masking, dropout)")
    eval_every: int = option(0, "steps between evaluations; 0: none during training")
    eval_batches: int = option(8, "batches of held-out data per evaluation")
    log_every: int = option(10, "steps between lines of metrics.jsonl")
    save_every: int = option(0, "steps between checkpoints; 0: only the final one")
    keep_last: int = option(2, "checkpoints kept on disk")
    parallel: str = option("none", "none | ddp | fsdp (under torchrun)")
    device: str = option("auto", "auto (cuda when available, else cpu), cpu, cuda, cuda:N or mps")
    progress: bool = option(True, "show a progress bar")

    def __post_init__(self) -> None:
        for name, kind in ((f.name, f.type) for f in dataclasses.fields(self)):
            _check_type(name, kind, getattr(self, name))
        self.betas = _betas(self.betas)
        if self.epochs is not None:
            _check_range("epochs", self.epochs, 0, None, open_low=True)
            if self.steps != DEFAULT_STEPS:
                raise ValueError(f"give steps ({self.steps}) or epochs ({self.epochs}), not both")
        for name in ("steps", "batch_size", "accumulation", "log_every", "keep_last", "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup", "eval_every", "save_every", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("lr", "eps"):
            _check_range(name, getattr(self, name), 0, None, open_low=True)
        for name in ("weight_decay", "clip"):
            _check_range(name, getattr(self, name), 0, None)
        _check_range("min_lr_ratio", self.min_lr_ratio, 0, 1)
        for name, choices in (("schedule", SCHEDULES), ("precision", PRECISIONS), ("parallel", PARALLEL)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}={getattr(self, name)!r} is not one of {', '.join(choices)}")
        check_device(self.device)

    def to_dict(self) -> dict:
        """Plain JSON-able dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        """Build from a dict; an unknown key is an error naming it, and so are both steps and epochs."""
        if data.get("steps") is not None and data.get("epochs") is not None:
            raise ValueError(f"give --steps ({data['steps']}) or epochs= ({data['epochs']}), not both")
        return options_from_dict(cls, data, "training")

    def for_data(self, examples: int, world: int = 1) -> tuple:
        """(this config with epochs turned into steps for a training set of `examples`, a line saying
        so, or None without epochs): ceil(epochs x examples / (batch_size x accumulation x world))."""
        if self.epochs is None:
            return self, None
        per_step = self.batch_size * self.accumulation * world
        steps = max(1, math.ceil(self.epochs * examples / per_step))
        line = (f"epochs={self.epochs:g}: {steps} steps ({examples} examples, {per_step} per step = "
                f"batch_size {self.batch_size} x accumulation {self.accumulation} x {world} process(es))")
        return dataclasses.replace(self, steps=steps, epochs=None), line


# what decides a run's data order, its updates and its schedule: a resumed run keeps the run's values
# (new ones would not continue it but start another run from its middle). The others are taken from
# the command line: logging, evaluation, checkpoints, device, parallelism, compile, and `steps`, so a
# finished run can be extended (its decay then spans the new total, which the resume line says)
RUN_OPTIONS = ("batch_size", "accumulation", "seed", "lr", "weight_decay", "betas", "eps", "warmup",
               "schedule", "min_lr_ratio", "clip", "precision")


def resumed_config(cfg: TrainConfig, run: dict) -> tuple:
    """(cfg with the run's RUN_OPTIONS from its trainer.json "train" dict, one line saying which options
    are kept from the run, which are taken from the command line, and which new values are ignored)."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    kept = TrainConfig.from_dict({**cfg.to_dict(), **{k: v for k, v in run.items() if k in RUN_OPTIONS}})
    ignored = [f"{k}={getattr(cfg, k)!r} (the run's: {getattr(kept, k)!r})" for k in RUN_OPTIONS
               if getattr(cfg, k) != getattr(kept, k)]
    line = (f"kept from the run: {', '.join(RUN_OPTIONS)}; taken from the command line: "
            f"{', '.join(sorted(known - set(RUN_OPTIONS)))}")
    if ignored:
        line += f"; ignored: {', '.join(ignored)}"
    if run.get("steps", cfg.steps) != cfg.steps and kept.schedule != "constant":
        line += f"; steps={cfg.steps} (the run's: {run['steps']}): the {kept.schedule} decay now spans {cfg.steps}"
    return kept, line


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
    if want is int and (not math.isfinite(number) or number != int(number)):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return int(number) if want is int else number


def _check_type(name: str, kind: str, value) -> None:
    """A field's value is of its declared type (a bool is not a number; None only where Optional)."""
    if value is None and kind.startswith("Optional"):
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {"int": isinstance(value, int) and not isinstance(value, bool), "float": number,
          "Optional[int]": isinstance(value, int) and not isinstance(value, bool), "Optional[float]": number,
          "bool": isinstance(value, bool), "str": isinstance(value, str)}.get(kind, True)
    if not ok:
        raise ValueError(f"{name} must be {'a number' if 'int' in kind or 'float' in kind else 'a ' + kind}, "
                         f"got {value!r}")


def _check_range(name: str, value, low, high, open_low: bool = False) -> None:
    """A finite number within [low, high] ((low, high] when open_low; None: no bound); None passes."""
    if value is None:
        return
    below = low is not None and (value <= low if open_low else value < low)
    if not math.isfinite(value) or below or (high is not None and value > high):
        bounds = f"{'>' if open_low else '>='} {low}" + (f" and <= {high}" if high is not None else "")
        raise ValueError(f"{name} must be a finite number {bounds}, got {value!r}")


def _betas(value) -> tuple:
    """AdamW's (beta1, beta2), each in [0, 1): from a pair of numbers or a "0.9,0.98" string."""
    try:
        betas = tuple(float(b) for b in (value.strip("()[] ").split(",") if isinstance(value, str) else value))
    except (TypeError, ValueError):
        betas = ()
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):  # NaN fails the comparison too
        raise ValueError(f"betas must be two numbers in [0, 1), e.g. betas=[0.9,0.999], got {value!r}")
    return betas


def check_device(name: str) -> None:
    """'auto', or a device torch knows and this machine has (device=cuda without CUDA is an error)."""
    import torch

    if name == "auto":
        return
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={name!r} is not a device: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        have = f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available() else "no CUDA"
        raise ValueError(f"device={name!r} but this machine has {have}; use device=auto or device=cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={name!r} but MPS is not available; use device=auto or device=cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device={name!r}: training runs on cpu, cuda or mps")
