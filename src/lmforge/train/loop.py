"""The one training loop: any objective, one process or many, resumable exactly.

Each optimiser step: reseed dropout from (seed, step, rank); run `accumulation` micro-batches (all-reduce on
the last; a token-level loss weighs every prediction of the step alike, on every process, else each
micro-batch's mean counts alike: config.accumulation); clip; AdamW; schedule. The step's loss and whether it
and the updated weights are finite stay on the device (train/speed.py): the host reads them only at a logged,
evaluated, saved or last step, so a CUDA step never waits for the GPU; a non-finite loss or weight then stops
the run, naming the first bad step. Rank 0 logs and writes checkpoints. A stop writes nothing (every save
follows a read): every checkpoint and the final model hold finite weights. A resume continues the newest
checkpoint that passes its checksums, with the run's model, objective and schedule (see config.RUN_OPTIONS).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from functools import partial
from pathlib import Path

import torch

from lmforge.config.options import OptionsError
from lmforge.fast.optimize import optimize
from lmforge.io import save
from lmforge.io.files import DiskFull
from lmforge.quant.int8 import refuse_int8
from lmforge.train import distributed as dist
from lmforge.train.checkpoint import (CheckpointCorrupt, NothingToResume, TrainingDiverged, all_finite,
                                      check_resumable, global_rngs_kept, latest_checkpoint, save_checkpoint,
                                      seed_all, set_rng_states, training_folder)
from lmforge.train.config import DEFAULT_STEPS, TrainConfig, evaluated_every, resumed_config, run_notes
from lmforge.train.data import StepBatches, data_change, data_fingerprint, derive_seed, eval_batches
from lmforge.train.distributed import resolve_device  # a name of this module too (tasks, the bake-off)
from lmforge.train.log import MetricsLog, Progress, plot_losses
from lmforge.train.memory import check_step_fits, longest_example
from lmforge.train.optim import build_optimizer, build_scheduler
from lmforge.train.optimizer_fit import check_optimizer
from lmforge.train.run_folder import check_start
from lmforge.train.speed import (Pending, checkpoint_blocks, finite_flag, held_out_metrics, read_record,
                                 step_loss, to_device, uncheckpoint_blocks, use_tf32)
from lmforge.utils.atomic import replace_dir

__all__ = ["NothingToResume", "Trainer", "TrainingDiverged", "check_resumable", "resolve_device"]


class Trainer:
    """Trains `objective` (which holds the model) on `train_data`, writing under `out`."""

    def __init__(self, objective, train_data, cfg: TrainConfig, out, eval_data=None, duplication: int = 0,
                 log=print, evaluator=None, lr_scale=None, settings: dict | None = None) -> None:
        # evaluator(trainer) -> metrics, run every cfg.eval_every steps and logged; {"stop": True} in
        # them ends training early (fine-tuning's early stopping); its state_dict() / load_state_dict(),
        # if it has them, travel in checkpoints so a resumed run stops where it would have (check_state,
        # if it has one, refuses a checkpoint's state before the run is rebuilt); lr_scale: see
        # optim.param_groups; settings: the job's options deciding the updates (refused if changed on resume)
        own = getattr(objective, "run_settings", dict)()  # an objective's own (DPR's temperature, pooling)
        self._settings = {"duplication": duplication, **own, **(settings or {})}
        self.cfg, self.out, self.log, self.evaluator = cfg, training_folder(out), log, evaluator
        refuse_int8(objective)
        self.device = resolve_device(cfg.device)
        if self.device.type == "cuda":
            # cuDNN's convolutions (ELMo's character CNN) may pick backward algorithms that sum in any
            # order: a seed fixes a GPU run only with the deterministic ones
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        use_tf32(self.device, cfg.tf32)
        self.rank, self.world = dist.init_from_env(self.device)
        # the accelerations, once, for the whole run (fast/optimize.py): same results as the plain layers
        self.objective = optimize(objective.to(self.device))
        # undone when fit ends, so the model it returns runs plain
        self._checkpointed = checkpoint_blocks(self.objective) if cfg.checkpointing else []
        self._data = (train_data, eval_data, duplication, lr_scale)
        self.module = dist.wrap(self.objective, cfg.parallel, self.device)
        if cfg.compile:
            self.module.compile()  # in place: parameter names, hence checkpoints, are unchanged
        self.epochs = cfg.epochs  # kept: a resumed run counts them with the run's batch size
        self.cfg = evaluated_every(self._count_epochs(cfg), evaluator is not None)
        self._build()
        self.step, self.last_checkpoint = 0, None
        self.stopped = False  # the evaluator ended training early (kept in checkpoints)
        self._fingerprint = None  # of the training data, computed at the first checkpoint or resume

    def _build(self) -> None:
        """Batches, evaluation set, optimiser and schedule from self.cfg (again on resume, with the run's)."""
        cfg, (train_data, eval_data, duplication, lr_scale) = self.cfg, self._data
        self.batches = StepBatches(train_data, self.objective, cfg.batch_size, cfg.accumulation, cfg.seed,
                                   self.rank, self.world, duplication)
        self.eval_set = (eval_batches(eval_data, self.objective, cfg.batch_size, cfg.eval_batches, cfg.seed)
                         if eval_data is not None and cfg.eval_every else [])
        self.optimizer = build_optimizer(self.module, cfg.lr, cfg.weight_decay, cfg.betas, cfg.eps, lr_scale)
        self.scheduler, self.pending = (build_scheduler(self.optimizer, cfg.warmup, cfg.steps, cfg.schedule,
                                                        cfg.min_lr_ratio), Pending(self.device))

    def _count_epochs(self, cfg: TrainConfig, counted_before: int | None = None) -> TrainConfig:
        """cfg with self.epochs (if given) turned into steps for this training set, said in the log
        (again on resume only if the count changed)."""
        if self.epochs is None:
            return cfg
        counted, line = dataclasses.replace(cfg, steps=DEFAULT_STEPS, epochs=self.epochs).for_data(
            len(self._data[0]), self.world)
        if self.main and counted.steps != counted_before:
            self.log(line)
        return counted

    @property
    def main(self) -> bool:
        """Whether this process logs and writes (rank 0)."""
        return self.rank == 0

    def _autocast(self):
        if self.cfg.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def resume(self) -> bool:
        """Continue from the newest usable checkpoint under out/checkpoints; False if there is none.
        Refuses (ValueError) when checkpoints exist but none is usable, or they are of another model or
        objective; keeps the run's RUN_OPTIONS over this trainer's, saying so in one line. It sets the
        global RNGs to the checkpoint's (fit gives the caller's back)."""
        found = latest_checkpoint(self.out / "checkpoints", warn=self.log if self.main else lambda m: None)
        if found is None:
            return False
        path, weights, optimizer, info = found
        self._check_same_run(path, info, weights)
        self._check_same_data(path, info.get("data"))
        if "evaluator" in info and hasattr(self.evaluator, "check_state"):  # before anything is loaded
            self.evaluator.check_state(info["evaluator"])
        try:  # an unverified (pre-checksum) trainer.json may hold options no run had: said of the file
            self.cfg, options = resumed_config(self.cfg, info.get("train") or {})
        except OptionsError as err:
            raise CheckpointCorrupt(f"checkpoint {path}: trainer.json's training options: {err}") from None
        self.cfg = self._count_epochs(self.cfg, self.cfg.steps)  # with the run's batch size, accumulation
        self._build()
        # before anything is loaded: a refusal leaves the objective as it was
        fresh = dist.optimizer_state(self.module, self.optimizer)
        check_optimizer(path, optimizer.get("optimizer"), fresh, weights)
        dist.load_full_state_dict(self.module, {k: v.to(self.device) for k, v in weights.items()})
        dist.load_optimizer_state(self.module, self.optimizer, optimizer["optimizer"])
        self.scheduler.load_state_dict(optimizer["scheduler"])
        set_rng_states(optimizer["rng"])
        if hasattr(self.objective, "carry"):
            self.objective.carry(optimizer.get("carried"))
        self.step, self.last_checkpoint = int(info["step"]), path
        note = self._resume_stop(info)
        if self.main:
            self.log(f"resumed from {path} (step {self.step}); {options}{note}")
        return True

    def _resume_stop(self, info: dict) -> str:
        """Carry the evaluator's state on and decide whether a run that stopped early stays stopped: by the
        evaluator's rule as given now (its stops(), where it has one: a resume may change patience), not
        silently by the run's; '' or what the resume line adds."""
        self.stopped = bool(info.get("stopped", False))
        if "evaluator" in info and hasattr(self.evaluator, "load_state_dict"):
            self.evaluator.load_state_dict(info["evaluator"])  # best score and patience carry on
        went_on = self.stopped and hasattr(self.evaluator, "stops") and not self.evaluator.stops()
        self.stopped = self.stopped and not went_on
        if went_on:
            return "; the run had stopped early, and its evaluator's rule as given now goes on"
        if self.stopped:
            return "; the run stopped early (its evaluator): nothing more is trained"
        # a finished run resumed: said, as its final files and evaluation are made again
        finished = self.step >= self.cfg.steps
        return "; the run had reached its last step: nothing more is trained" if finished else ""

    def _identity(self) -> dict:
        """What a checkpoint must have been trained with to be resumed here: model, objective, settings."""
        model = getattr(self.objective, "model", None)
        config = getattr(model, "config", None)
        name = getattr(self.objective, "kind", None) or getattr(self.objective, "name", None)
        name = name or type(self.objective).__name__
        if getattr(self.objective, "whole_word", False):
            name += " (whole words)"
        # through JSON, as trainer.json holds it (tuples become lists)
        return json.loads(json.dumps({"model": config.canonical().to_dict() if config is not None else None,
                                      "objective": name, "settings": self._settings}))

    def _check_same_run(self, path: Path, info: dict, weights: dict) -> None:
        """ValueError naming what differs if the checkpoint is of another model, objective, settings or
        number of processes (whose micro-batches and dropout would differ)."""
        now, problems = self._identity(), []
        if info.get("objective", now["objective"]) != now["objective"]:
            problems.append(f"objective {info['objective']!r} (the run's) vs {now['objective']!r} (now)")
        if info.get("model") and now["model"]:
            saved, model = info["model"], now["model"]
            problems += [f"{k}={saved.get(k)!r} (the run's) vs {model.get(k)!r} (now)"
                         for k in sorted(set(saved) | set(model)) if saved.get(k) != model.get(k)]
        if info.get("world", self.world) != self.world:
            problems.append(f"{info['world']} processes (the run's) vs {self.world} (now)")
        saved = info.get("settings") or {}  # none in a checkpoint from before they were recorded
        problems += [f"{k}={saved[k]!r} (the run's) vs {now['settings'][k]!r} (now)"
                     for k in sorted(saved) if k in now["settings"] and saved[k] != now["settings"][k]]
        own = {k: tuple(v.shape) for k, v in self.objective.state_dict().items()}
        theirs = {k: tuple(v.shape) for k, v in weights.items()}
        if not problems and own != theirs:  # checkpoints that predate the recorded identity
            problems = [f"{k}: {theirs.get(k)} (the run's) vs {own.get(k)} (now)"
                        for k in sorted(set(own) | set(theirs)) if own.get(k) != theirs.get(k)]
        if problems:
            more = f" and {len(problems) - 6} more" if len(problems) > 6 else ""
            raise ValueError(f"cannot resume {path}: it was trained with another model or objective: "
                             f"{'; '.join(problems[:6])}{more}; resume with the run's settings or choose "
                             f"another out (--out)")

    def _data_identity(self) -> dict:
        """The training data's fingerprint (train/data.py), computed once per run."""
        if self._fingerprint is None:
            self._fingerprint = data_fingerprint(self._data[0])
        return self._fingerprint

    def _check_same_data(self, path: Path, run: dict | None) -> None:
        """ValueError if the checkpoint's run was trained on other data (a changed --train file):
        its batches would not be the ones the step numbers promise. Checkpoints before fingerprints pass."""
        change = data_change(run, self._data_identity())
        if change is not None:
            raise ValueError(f"cannot resume {path}: it was trained on other data ({change}); resume with "
                             "the run's training data or choose another out (--out)")

    def _micro_step(self, batch: dict, last: bool) -> tuple:
        # backward runs even on a non-finite loss, so every rank joins the all-reduce (_update refuses it)
        with dist.no_sync(self.module, last):
            with self._autocast():
                out = self.module(to_device(batch, self.device))
            loss, count = out.loss.float(), out.count
            # a counted loss backpropagates its sum; the step's count divides the gradients (step_loss)
            (loss * count if count is not None else loss / self.cfg.accumulation).backward()
        return loss.detach(), count, out.metrics

    def train_step(self) -> dict:
        """One optimiser step over this process's micro-batches; returns its metrics, as device tensors
        where the step computed them. It reseeds the global RNGs: fit gives the caller's back, a direct
        call does not (wrap it in train.checkpoint.global_rngs_kept)."""
        seed_all(derive_seed(self.cfg.seed, self.step, self.rank, 3))  # dropout, sampling
        self.module.train()
        batches = self.batches.micro_batches(self.step)
        losses, counts, metrics, tokens = [], [], {}, 0
        for i, batch in enumerate(batches):
            loss, count, extra = self._micro_step(batch, i == len(batches) - 1)
            losses.append(loss)
            counts.append(count)
            tokens += int(batch["attention_mask"].sum())  # a host tensor: no wait for the device
            for k, v in extra.items():
                v = v.detach().double() if isinstance(v, torch.Tensor) else float(v)
                metrics[k] = metrics.get(k, 0.0) + v / len(batches)
        synced = 1 if self.cfg.parallel == "none" else self.world  # processes whose gradients are averaged
        loss = step_loss(losses, counts, self.module.parameters(), synced)
        norm, lr, weights_ok = self._update(loss)
        self.pending.note(self.step + 1, loss, weights_ok, lr)
        # the lr this step's update used (as the reference Trainer logs it), not the next step's
        return {"loss": loss, "lr": lr, "grad_norm": norm, "tokens": tokens * self.world, **metrics}

    def _read(self, record: dict) -> dict:
        """The record in numbers (averaged over processes), after the guards: TrainingDiverged naming
        the first step since the last read whose loss or updated weights were not finite."""
        params = list(self.module.parameters())
        bad_loss, bad_weights, lr = self.pending.read(params, self.world)
        if bad_loss is not None:
            self._diverged(f"the loss is not finite at step {bad_loss}")
        if bad_weights is not None:
            self._diverged(f"the weights are not finite after the update of step {bad_weights} (lr {lr:.3g})")
        record = read_record(record)
        same = ("lr", "grad_norm")  # equal on every process already
        return {k: v if k in same else dist.all_mean(v, self.device) for k, v in record.items()}

    def _diverged(self, what: str) -> None:
        where = self.last_checkpoint or "none (no checkpoint was written)"
        raise TrainingDiverged(f"training diverged: {what}; stopped without saving anything (a lower lr= "
                               f"may help); last good checkpoint: {where}")

    def _update(self, loss: torch.Tensor) -> tuple:
        """Clip, AdamW (not on a non-finite loss), schedule: (gradient norm, the lr used, whether the
        weights are finite), the first and last as device tensors."""
        if self.optimizer.defaults.get("fused"):
            # the fused kernel skips the whole update, its step count included, where found_inf is 1:
            # a non-finite loss leaves the weights untouched without the host waiting for the loss
            self.optimizer.found_inf = (~torch.isfinite(loss)).float()
        elif not bool(torch.isfinite(loss)):  # the per-tensor loop (FSDP shards) has no such switch
            self.optimizer.zero_grad(set_to_none=True)
            self._diverged(f"the loss is not finite at step {self.step + 1}")
        params = [p for p in self.module.parameters() if p.grad is not None]
        # with clip=None the norm is still measured (for the log); FSDP's sharded norms are DTensors
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.clip or float("inf"))
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        # a finite loss can still take the weights past float range (lr=1e39): flagged after every
        # update (a sum per tensor, ~3 % of a tiny CPU step), read with the step's loss (_read)
        lr = self.scheduler.get_last_lr()[0]
        weights_ok = finite_flag(params)
        self.scheduler.step()
        return norm, lr, weights_ok

    def evaluate(self) -> dict:
        """Loss and metrics over the fixed evaluation batches, each batch's weighted by its examples."""
        return held_out_metrics(self.module, self.eval_set, self.device, self._autocast)

    def run_evaluator(self) -> dict:
        """The evaluator's metrics now (every rank calls it), FSDP's root weights gathered (root_gathered), as
        rank 0 found them on every rank: an evaluator saying "stop" on one rank alone would part the ranks."""
        with dist.root_gathered(self.module):
            found = dict(self.evaluator(self))
        return dist.from_root(found)

    def write_model(self, write) -> None:
        """write(state) on rank 0, `state` the whole weights (dist.model_state: every rank calls this)."""
        state = dist.model_state(self.module)
        if self.main:
            write(state)

    def save(self) -> None:
        """Write a checkpoint of the current step (every rank joins; rank 0 writes)."""
        weights = dist.full_state_dict(self.module)
        optimizer = {"optimizer": dist.optimizer_state(self.module, self.optimizer),
                     "scheduler": self.scheduler.state_dict()}
        carried = self.objective.carried() if hasattr(self.objective, "carried") else None
        if carried is not None:  # ELMo's stateful LSTM states: the next batch starts from them
            optimizer["carried"] = carried
        if self.main:
            info = {"train": self.cfg.to_dict(), "world": self.world, "stopped": self.stopped}
            if hasattr(self.evaluator, "state_dict"):
                info["evaluator"] = self.evaluator.state_dict()
            info.update(self._identity(), data=self._data_identity())
            try:
                self.last_checkpoint = save_checkpoint(self.out / "checkpoints", self.step, weights,
                                                       optimizer, info, self.cfg.keep_last)
            except DiskFull as err:
                kept = (f"; the previous checkpoint {self.last_checkpoint} is kept" if self.last_checkpoint
                        else "")
                raise DiskFull(err.path, kept) from None
        if self.world > 1:
            torch.distributed.barrier()

    def _warn(self) -> None:
        """Rank 0 logs what run_notes says of this run's settings (an eval_every that evaluates nothing)."""
        for line in run_notes(self.cfg, len(self._data[0]), self._data[2], self.world,
                              bool(self.eval_set) or self.evaluator is not None) if self.main else ():
            self.log(line)

    def fit(self, resume: bool = False, final_files: tuple = ()):
        """Train to cfg.steps (continuing a checkpoint if resume) and return the model kept, in out/final
        with what each of `final_files` (folder -> None: the tokenizer's save, a task's files) writes. The
        global RNGs each step reseeds (torch's, Python's, NumPy's) are the caller's again after it."""
        with global_rngs_kept():
            check_start(self.out, resume)  # a checkpoint to continue, or none of another run
            if resume:
                self.resume()
            self._warn()
            if self.step < self.cfg.steps and self.cfg.memory_check:  # past the memory: killed, not refused
                first = self.batches.micro_batch(self.step, 0)  # drawn again, the same, by the step
                check_step_fits(getattr(self.objective, "model", None), first, self.device,
                                self.cfg.checkpointing, longest_example(self._data[0]))
            metrics = MetricsLog(self.out / "metrics.jsonl", self.step) if self.main else None
            label = f"train ({self.epochs:g} epochs)" if self.epochs is not None else "train"
            bar = Progress(self.cfg.steps, self.step, self.main and self.cfg.progress, label)
            try:
                self._loop(metrics, bar)
            finally:
                bar.close()
                uncheckpoint_blocks(self._checkpointed)
            model = self.objective.finish()
            self.write_model(partial(self._save_final, model, final_files))  # every rank joins the gather
            return model

    def _save_final(self, model, final_files: tuple, state: dict | None) -> None:
        # out/final, then loss.png, on rank 0 (write_model): `state` the gathered weights of several processes
        if not all_finite(model.state_dict().values() if state is None else state.values()):
            self._diverged("the final weights are not finite")
        # staged and put in place whole: a kill leaves the last final/ or none, never a part of one
        # that a later job would load, and a link named final/ is replaced, not written through
        writers = (partial(save, model, state=state), *final_files)
        replace_dir(self.out / "final", lambda folder: [write(folder) for write in writers])
        plot_losses(self.out / "metrics.jsonl", self.out / "loss.png", getattr(self.objective, "name", ""))

    def _loop(self, metrics, bar) -> None:
        start, seen, shown = time.perf_counter(), 0, None
        while self.step < self.cfg.steps and not self.stopped:
            record = self.train_step()
            self.step += 1
            seen += record.pop("tokens")
            speed = seen / (time.perf_counter() - start)
            evaluating = self.cfg.eval_every and self.step % self.cfg.eval_every == 0
            every = self.cfg.save_every and self.step % self.cfg.save_every == 0
            # the host reads the device only here (speed.Pending): before any log, evaluation or save
            if evaluating or every or self.step % self.cfg.log_every == 0 or self.step == self.cfg.steps:
                record = self._read(record)
                shown = record["loss"]
            if evaluating and self.eval_set:
                record.update(self.evaluate())
            found = self.run_evaluator() if evaluating and self.evaluator is not None else {}
            stop = self.stopped = bool(found.pop("stop", False))
            record.update(found)
            if self.main and (self.step % self.cfg.log_every == 0 or self.step == self.cfg.steps
                              or "eval_loss" in record or found):
                metrics.write({"step": self.step, **record, "tokens_per_s": speed,
                               "elapsed_s": time.perf_counter() - start})
            bar.update(self.step, shown, speed)  # the loss last read
            if every or stop or self.step == self.cfg.steps:
                self.save()
            if stop:
                break
