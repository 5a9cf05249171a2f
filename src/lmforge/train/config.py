"""TrainConfig: every knob of the one training loop, validated on creation."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

from lmforge.config.options import (MAX_SEED, Items, OptionsError, base_type, check_options, coerce,
                                    from_dict, option)
from lmforge.train.optim import SCHEDULES
from lmforge.utils.errors import shown

PRECISIONS = ("fp32", "bf16")
PARALLEL = ("none", "ddp", "fsdp")
DEFAULT_STEPS = 1000
MAX_STEPS = 10_000_000  # every count of steps (steps, warmup, the *_every) is bounded by it


@dataclass
class TrainConfig:
    """How to train: batch, optimiser, schedule, precision, evaluation, checkpoints, logging."""

    steps: int = option(DEFAULT_STEPS, "optimiser steps (--steps); not with epochs", low=1, high=MAX_STEPS)
    # epochs become steps where the training set's size is known (Trainer): ceil(epochs x examples /
    # examples per step), so a run's trainer.json records the steps it took, not the epochs
    epochs: Optional[float] = option(None, "passes over the training set, instead of steps (e.g. 3 or 0.5)",
                                     low=0, high=10_000, open_low=True)
    batch_size: int = option(32, "examples per micro-batch per process", low=1, high=65536)
    # a token-level loss (MLM, CLM, PLM, prefix LM, seq2seq: Loss.count) is the mean over every target of
    # the step, on every process, as one big batch's (the reference Trainer's num_items_in_batch), though
    # micro-batches hold unequal target counts (masking, padded text); other losses (sums of parts, per
    # example) are the mean of the micro-batches' means
    accumulation: int = option(1, "micro-batches per optimiser step (global batch = batch_size x "
                                  "accumulation x processes); a token-level loss weighs every target of "
                                  "the step alike, others each micro-batch's mean", low=1, high=4096)
    lr: float = option(1e-4, "peak learning rate (AdamW)", low=0, high=10, open_low=True)
    weight_decay: float = option(0.01, "AdamW's decoupled weight decay (not on biases and norms)",
                                 low=0, high=10)
    betas: tuple = option((0.9, 0.999), "AdamW's (beta1, beta2)", items=Items("float", 2, min_items=2), low=0,
                          high=1, open_high=True)
    eps: float = option(1e-6, "AdamW's epsilon (BERT's 1e-6; torch's and the reference Trainer's default "
                              "is 1e-8)", low=0, high=1, open_low=True)
    warmup: int = option(100, "steps of linear warm-up from 0 to lr", low=0, high=MAX_STEPS)
    schedule: str = option("linear", f"decay after warm-up: {' | '.join(SCHEDULES)}", choices=SCHEDULES)
    min_lr_ratio: float = option(0.0, "the decay ends at lr x this", low=0, high=1)
    clip: Optional[float] = option(1.0, "global gradient-norm clipping; null (or 0): off",
                                   low=0, high=1_000_000)
    precision: str = option("fp32", "fp32, or bf16: autocast on CPU and GPU (weights, optimiser stay fp32)",
                            choices=PRECISIONS)
    compile: bool = option(False, "torch.compile the objective (model + heads): same results, slow start")
    tf32: bool = option(True, "on CUDA: fp32 matmuls on TF32 tensor cores (10-bit mantissa products, fp32 "
                              "sums); false: exact fp32. No effect elsewhere")
    checkpointing: bool = option(False, "activation checkpointing: each block's activations are "
                                        "recomputed in the backward pass (less memory, ~1/3 more compute, "
                                        "same gradients)")
    seed: int = option(0, "seed of everything the run draws (initial weights, data order, masking, dropout)",
                       low=0, high=MAX_SEED)
    eval_every: Optional[int] = option(None, "steps between evaluations; null: a tenth of the steps where "
                                       "the run validates (fine-tuning given validation data, an "
                                       "evaluator), else none; 0: none during training", low=0,
                                       high=MAX_STEPS)
    eval_batches: int = option(8, "batches of held-out data per evaluation", low=1, high=100_000)
    log_every: int = option(10, "steps between lines of metrics.jsonl", low=1, high=MAX_STEPS)
    save_every: int = option(0, "steps between checkpoints; 0: only the final one", low=0, high=MAX_STEPS)
    keep_last: int = option(2, "checkpoints kept on disk", low=1, high=1000)
    parallel: str = option("none", "none | ddp | fsdp: under torchrun with several processes ddp or fsdp "
                                   "(none is refused there)", choices=PARALLEL)
    device: str = option("auto", "auto (cuda when available, else cpu), cpu, cuda, cuda:N or mps; under "
                                 "torchrun, cuda (or auto) is each process's cuda:LOCAL_RANK")
    progress: bool = option(True, "show a progress bar")
    memory_check: bool = option(True, "refuse a micro-batch estimated past the free memory before the first "
                                "step (train/memory.py; the estimate errs high: false runs it anyway)")

    def __post_init__(self) -> None:
        if isinstance(self.betas, str):  # "0.9,0.98" from a command line
            self.betas = _betas(self.betas)
        check_options(self)  # types (a bool is not a number, "false" is not a bool), bounds, choices
        self.betas = tuple(self.betas)  # a JSON list kept as the pair AdamW takes
        if self.epochs is not None and self.steps != DEFAULT_STEPS:
            raise OptionsError(f"give steps ({self.steps}) or epochs ({self.epochs}), not both", "epochs")
        check_device(self.device)

    def to_dict(self) -> dict:
        """Plain JSON-able dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        """Build from a dict; an unknown key is an error naming it, and so are both steps and epochs."""
        if isinstance(data, dict) and data.get("steps") is not None and data.get("epochs") is not None:
            raise OptionsError(f"give steps={data['steps']} (--steps) or epochs={data['epochs']}, not both",
                               "epochs")
        return options_from_dict(cls, data, "training")

    def for_data(self, examples: int, world: int = 1) -> tuple:
        """(this config with epochs turned into steps for a training set of `examples`, a line saying
        so, or None without epochs): ceil(epochs x examples / (batch_size x accumulation x world))."""
        if self.epochs is None:
            return self, None
        per_step = self.batch_size * self.accumulation * world
        steps = max(1, math.ceil(self.epochs * examples / per_step))
        if steps > MAX_STEPS:
            raise OptionsError(f"epochs={self.epochs:g} over {examples} examples is {steps} steps, more than "
                               f"{MAX_STEPS}", "epochs")
        line = (f"epochs={self.epochs:g}: {steps} steps ({examples} examples, {per_step} per step = "
                f"batch_size {self.batch_size} x accumulation {self.accumulation} x {world} process(es))")
        return dataclasses.replace(self, steps=steps, epochs=None), line


def run_notes(cfg: TrainConfig, examples: int, duplication: int = 0, world: int = 1,
              evaluates: bool = True) -> list:
    """Lines a run logs at its start on settings that do not do what they seem to (not errors): static
    masking's `duplication` copies outnumbering the run's epochs over `examples`; a warm-up as long as it;
    an eval_every that evaluates nothing (past the run's steps, or without held-out data or evaluator)."""
    notes = _eval_notes(cfg, evaluates)
    epochs = cfg.steps * cfg.batch_size * cfg.accumulation * world / max(1, examples)
    if duplication and duplication >= epochs:
        notes.append(f"warning: duplication={duplication} is not below the {epochs:.2f} epochs of this run: "
                     f"no example's corruption is seen twice, so static masking here equals dynamic masking")
    if cfg.warmup >= cfg.steps:  # the lr at step i (from 0) is lr x i / warmup during the warm-up
        sign = ">" if cfg.warmup > cfg.steps else "="
        most = cfg.lr * (cfg.steps - 1) / cfg.warmup  # the last update's
        notes.append(f"note: warmup={cfg.warmup} {sign} steps={cfg.steps}: the learning rate rises for the "
                     f"whole run and never reaches lr={cfg.lr:g} (at most {most:.3g})")
    elif cfg.warmup and cfg.warmup == cfg.steps - 1:
        notes.append(f"note: warmup={cfg.warmup} = steps={cfg.steps} - 1: the learning rate rises for the "
                     f"whole run and reaches lr={cfg.lr:g} at its last step only (no decay)")
    return notes


def evaluated_every(cfg: TrainConfig, validates: bool) -> TrainConfig:
    """cfg with eval_every given a number: its own, else a tenth of the steps (at least 1) where the run
    validates with an evaluator, else 0; one rule for the commands and the Python calls alike."""
    if cfg.eval_every is not None:
        return cfg
    return dataclasses.replace(cfg, eval_every=max(1, cfg.steps // 10) if validates else 0)


def _eval_notes(cfg: TrainConfig, evaluates: bool) -> list:
    """run_notes' lines on an eval_every that never evaluates (the reference Trainer refuses the second)."""
    if not cfg.eval_every:
        return []
    if not evaluates:
        return [f"note: eval_every={cfg.eval_every} but the run has no held-out data (eval_data) nor "
                f"evaluator: nothing is evaluated"]
    if cfg.eval_every > cfg.steps:
        return [f"note: eval_every={cfg.eval_every} > steps={cfg.steps}: nothing is evaluated during this "
                "run"]
    return []


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
        line += (f"; steps={cfg.steps} (the run's: {run['steps']}): the {kept.schedule} decay now spans "
                 f"{cfg.steps}")
    return kept, line


def options_from_dict(cls, data: dict, what: str):
    """The options dataclass `cls` from a dict; an unknown key is an OptionsError naming it and the known
    ones. A number field may be given as a numeric string (YAML 1.1 reads 1e-4 as one); a bool is not."""
    if isinstance(data, dict):
        kinds = {f.name: base_type(f.type)[0] for f in dataclasses.fields(cls)}
        data = {k: coerce(cls, k, v) if kinds.get(k) in ("int", "float") and isinstance(v, str) else v
                for k, v in data.items()}
    return from_dict(cls, data, what)


def _betas(text: str) -> list:
    """AdamW's betas from a "0.9,0.98" string (check_options judges the pair)."""
    parts = [part.strip() for part in text.strip("()[] ").split(",")]
    try:
        return [float(part) for part in parts]
    except ValueError:
        raise OptionsError(f"betas must be two numbers in [0, 1), e.g. betas=0.9,0.999, got {shown(text)}",
                           "betas") from None


def check_ranks(cfg: TrainConfig) -> TrainConfig:
    """`cfg`, refused (an OptionsError, one line) where the processes of a torchrun job of several would not
    train it as one run: parallel=none, or no GPU of the node for this LOCAL_RANK (process_device); pretrain
    and finetune check it before they read anything, the command line before it reads a file."""
    from lmforge.train.distributed import process_device, refuse_unsynced

    refuse_unsynced(cfg.parallel)
    process_device(cfg.device)
    return cfg


def check_device(name: str) -> None:
    """'auto', or a device torch knows and this machine has (device=cuda without CUDA is an error)."""
    import torch

    if name == "auto":
        return
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise OptionsError(f"device={shown(name)} is not a device: use auto, cpu, cuda, cuda:N or mps",
                           "device") from None
    if device.type == "cuda" and (not torch.cuda.is_available() or
                                  (device.index or 0) >= torch.cuda.device_count()):
        have = f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available() else "no CUDA"
        raise OptionsError(f"device={shown(name)} but this machine has {have}; use device=auto or device=cpu",
                           "device")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise OptionsError(f"device={shown(name)} but MPS is not available; use device=auto or device=cpu",
                           "device")
    if device.type not in ("cpu", "cuda", "mps"):
        raise OptionsError(f"device={shown(name)}: training runs on cpu, cuda or mps", "device")
