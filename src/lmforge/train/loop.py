"""The one training loop: any objective, one process or many, resumable exactly.

Each optimiser step: reseed dropout from (seed, step, rank); run `accumulation`
micro-batches (gradient all-reduce only on the last); stop on a non-finite loss before
touching the weights; clip; AdamW; schedule. Rank 0 logs and writes checkpoints.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch

from lmforge.io import save
from lmforge.train import distributed as dist
from lmforge.train.checkpoint import latest_checkpoint, save_checkpoint, set_rng_states
from lmforge.train.config import TrainConfig
from lmforge.train.data import StepBatches, derive_seed, eval_batches
from lmforge.train.log import MetricsLog, Progress, plot_losses
from lmforge.train.optim import build_optimizer, build_scheduler


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the weights of the last good checkpoint are kept."""


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


class Trainer:
    """Trains `objective` (which holds the model) on `train_data`, writing under `out`."""

    def __init__(self, objective, train_data, cfg: TrainConfig, out, eval_data=None, duplication: int = 0,
                 log=print, evaluator=None, lr_scale=None) -> None:
        # evaluator(trainer) -> metrics, run every cfg.eval_every steps and logged; {"stop": True} in
        # them ends training early (fine-tuning's early stopping); its state_dict() / load_state_dict(),
        # if it has them, travel in checkpoints so a resumed run stops where it would have;
        # lr_scale: see optim.param_groups
        self.cfg, self.out, self.log, self.evaluator = cfg, Path(out), log, evaluator
        self.device = resolve_device(cfg.device)
        self.rank, self.world = dist.init_from_env(self.device)
        self.objective = objective.to(self.device)
        self.batches = StepBatches(train_data, objective, cfg.batch_size, cfg.accumulation, cfg.seed,
                                   self.rank, self.world, duplication)
        self.eval_set = (eval_batches(eval_data, objective, cfg.batch_size, cfg.eval_batches, cfg.seed)
                         if eval_data is not None and cfg.eval_every else [])
        self.module = dist.wrap(self.objective, cfg.parallel, self.device)
        if cfg.compile:
            self.module.compile()  # in place: parameter names, hence checkpoints, are unchanged
        self.optimizer = build_optimizer(self.module, cfg.lr, cfg.weight_decay, cfg.betas, cfg.eps, lr_scale)
        self.scheduler = build_scheduler(self.optimizer, cfg.warmup, cfg.steps, cfg.schedule, cfg.min_lr_ratio)
        self.step = 0
        self.last_checkpoint = None
        self.stopped = False  # the evaluator ended training early (kept in checkpoints)

    @property
    def main(self) -> bool:
        """Whether this process logs and writes (rank 0)."""
        return self.rank == 0

    def _autocast(self):
        if self.cfg.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def resume(self) -> bool:
        """Continue from the newest readable checkpoint under out/checkpoints; False if none."""
        found = latest_checkpoint(self.out / "checkpoints", warn=self.log)
        if found is None:
            return False
        path, weights, optimizer, info = found
        dist.load_full_state_dict(self.module, {k: v.to(self.device) for k, v in weights.items()})
        dist.load_optimizer_state(self.module, self.optimizer, optimizer["optimizer"])
        self.scheduler.load_state_dict(optimizer["scheduler"])
        set_rng_states(optimizer["rng"])
        self.step, self.last_checkpoint = int(info["step"]), path
        self.stopped = bool(info.get("stopped", False))
        if "evaluator" in info and hasattr(self.evaluator, "load_state_dict"):
            self.evaluator.load_state_dict(info["evaluator"])  # best score and patience carry on
        if self.main:
            self.log(f"resumed from {path} (step {self.step})")
        return True

    def _micro_step(self, batch: dict, last: bool) -> tuple:
        # backward runs even on a non-finite loss so every rank joins the all-reduce;
        # the step is then refused before the optimiser touches the weights
        with dist.no_sync(self.module, last):
            with self._autocast():
                out = self.module(_to(batch, self.device))
            loss = out.loss.float()
            (loss / self.cfg.accumulation).backward()
        return float(loss.detach()), out.metrics

    def train_step(self) -> dict:
        """One optimiser step over this process's micro-batches; returns its metrics."""
        torch.manual_seed(derive_seed(self.cfg.seed, self.step, self.rank, 3))  # dropout, sampling
        self.module.train()
        batches = self.batches.micro_batches(self.step)
        losses, metrics, tokens = [], {}, 0
        for i, batch in enumerate(batches):
            loss, extra = self._micro_step(batch, i == len(batches) - 1)
            losses.append(loss)
            tokens += int(batch["attention_mask"].sum())
            for k, v in extra.items():
                metrics[k] = metrics.get(k, 0.0) + float(v) / len(batches)
        loss = dist.all_mean(sum(losses) / len(losses), self.device)
        if not torch.isfinite(torch.tensor(loss)):
            self.optimizer.zero_grad(set_to_none=True)
            where = self.last_checkpoint or "none written yet"
            raise TrainingDiverged(f"the loss is {loss} at step {self.step + 1}; stopped before updating "
                                   f"the weights; last good checkpoint: {where}")
        norm = self._update()
        return {"loss": loss, "lr": self.scheduler.get_last_lr()[0], "grad_norm": norm,
                "tokens": tokens * self.world, **{k: dist.all_mean(v, self.device) for k, v in metrics.items()}}

    def _update(self) -> float:
        params = [p for p in self.module.parameters() if p.grad is not None]
        # with clip=None the norm is still measured (for the log); FSDP's sharded norms are DTensors
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.clip or float("inf"))
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Mean loss and metrics over the fixed evaluation batches."""
        self.module.eval()
        totals: dict = {}
        for batch in self.eval_set:
            with self._autocast():
                out = self.module(_to(batch, self.device))
            for k, v in {"loss": out.loss, **out.metrics}.items():
                totals[k] = totals.get(k, 0.0) + float(v) / len(self.eval_set)
        return {f"eval_{k}": dist.all_mean(v, self.device) for k, v in totals.items()}

    def save(self) -> None:
        """Write a checkpoint of the current step (every rank joins; rank 0 writes)."""
        weights = dist.full_state_dict(self.module)
        optimizer = {"optimizer": dist.optimizer_state(self.module, self.optimizer),
                     "scheduler": self.scheduler.state_dict()}
        if self.main:
            info = {"train": self.cfg.to_dict(), "world": self.world, "stopped": self.stopped}
            if hasattr(self.evaluator, "state_dict"):
                info["evaluator"] = self.evaluator.state_dict()
            self.last_checkpoint = save_checkpoint(self.out / "checkpoints", self.step, weights, optimizer,
                                                   info, self.cfg.keep_last)
        if self.world > 1:
            torch.distributed.barrier()

    def fit(self, resume: bool = False):
        """Train to cfg.steps (continuing a checkpoint if resume) and return the model kept."""
        if resume:
            self.resume()
        elif (self.out / "checkpoints").is_dir() and any((self.out / "checkpoints").iterdir()):
            raise FileExistsError(f"{self.out} already holds checkpoints: pass resume=True (--resume) "
                                  f"or choose another output directory")
        metrics = MetricsLog(self.out / "metrics.jsonl", self.step) if self.main else None
        bar = Progress(self.cfg.steps, self.step, self.main and self.cfg.progress)
        try:
            self._loop(metrics, bar)
        finally:
            bar.close()
        model = self.objective.finish()
        self._save_final(model)
        if self.main:
            plot_losses(self.out / "metrics.jsonl", self.out / "loss.png", getattr(self.objective, "name", ""))
        return model

    def _save_final(self, model) -> None:
        # under FSDP the weights are shards: every rank joins the gather, rank 0 writes
        state = None
        if self.world > 1:
            full = dist.full_state_dict(self.module)
            state = {k.removeprefix("model."): v for k, v in full.items() if k.startswith("model.")}
        if self.main:
            save(model, self.out / "final", state=state)

    def _loop(self, metrics, bar) -> None:
        start, seen = time.perf_counter(), 0
        while self.step < self.cfg.steps and not self.stopped:
            record = self.train_step()
            self.step += 1
            seen += record.pop("tokens")
            speed = seen / (time.perf_counter() - start)
            evaluating = self.cfg.eval_every and self.step % self.cfg.eval_every == 0
            if evaluating and self.eval_set:
                record.update(self.evaluate())
            found = dict(self.evaluator(self)) if evaluating and self.evaluator is not None else {}
            stop = self.stopped = bool(found.pop("stop", False))
            record.update(found)
            if self.main and (self.step % self.cfg.log_every == 0 or self.step == self.cfg.steps
                              or "eval_loss" in record or found):
                metrics.write({"step": self.step, **record, "tokens_per_s": speed,
                               "elapsed_s": time.perf_counter() - start})
            bar.update(self.step, record["loss"], speed)
            every = self.cfg.save_every and self.step % self.cfg.save_every == 0
            if every or stop or self.step == self.cfg.steps:
                self.save()
            if stop:
                break
