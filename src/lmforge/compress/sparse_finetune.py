"""Fine-tuning with unstructured pruning (compress/sparsity.py) on the one trainer, and its report.

The task is wrapped by `Pruning`, an objective that advances the cubic schedule at each
optimiser step and logs the sparsity; validation runs on the masked model, so metrics.jsonl
holds the accuracy curve as the sparsity rises. At the end the masks are baked into the
weights: OUT/final is a plain model directory (zeros in the weights) that `lmforge evaluate`
loads like any other. Soft movement adds its L1 penalty to the training loss (task_loss and
l1_penalty are logged beside it). Unstructured zeros shrink neither the dense matrices nor their time:
the report measures it, and says so. With movement pruning the scores are an AdamW group of
their own (lr x scores_lr_scale), listed first, so the lr column of metrics.jsonl is theirs.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from lmforge.compress.measure import given_data, measure_side_by_side
from lmforge.compress.model_files import output_folder
from lmforge.compress.sparsity import METHODS, Pruner, is_score, kept_by_matrix, weight_sparsity
from lmforge.config import atomic_write_text, option
from lmforge.config.options import OptionsError, check_options, instance_of, refuse_changed
from lmforge.io import model_dir as resolve_dir
from lmforge.objectives.base import Loss, Objective
from lmforge.tasks.fields import given_records
from lmforge.tasks.finetune import (HEAD_SEED, TaskConfig, Validator, check_validated, checkpoint_defaults,
                                    encode_split, fine_tuned_task, load_model, make_task, task_info,
                                    trained_settings, write_task_files)
from lmforge.tasks.reference import fine_tuned_for
from lmforge.train import TrainConfig, Trainer
from lmforge.train.checkpoint import RUN_FILES, STATE_KEY, checkpoints, training_folder
from lmforge.train.config import options_from_dict
from lmforge.train.data import derive_seed
from lmforge.train.run_folder import run_folder
from lmforge.utils.checksum import sign, verify
from lmforge.utils.ranks import one_process

SETTINGS = "prune_settings.json"  # the run's pruning settings: a resume with others is refused
SPARSE_WRITES = (*RUN_FILES, SETTINGS, "prune.json")  # what a magnitude or movement run writes under out
NOTE = ("unstructured zeros keep the matrices dense: same size on disk, no speed-up from dense "
        "kernels (the time ratio is measured, not assumed)")


# the methods that read a schedule option (another one given it is refused: SparseConfig)
READ_BY = {"scores_lr_scale": ("movement", "soft-movement"), "soft_lambda": ("soft-movement",)}
# the key=value options (method, sparsity: flags)
SCHEDULE = ("start", "end", "scores_lr_scale", "soft_lambda")
# fine-tuning's freezing and layer-wise decay (TaskConfig): prune_finetune trains every block at one rate
UNREAD = ("freeze_embeddings", "freeze_layers", "freeze_backbone", "layer_decay")


@dataclass
class SparseConfig:
    """Options of pruning during fine-tuning: the method, the sparsity, the schedule's span and the
    scores' learning rate. method and sparsity have no default: give both."""

    method: str | None = option(None, "magnitude, movement or soft-movement (required)", choices=METHODS)
    sparsity: float | None = option(None, "share of the blocks' Linear weights removed (required)", low=0,
                                    high=1, open_low=True, open_high=True)
    start: float = option(0.1, "share of the steps before pruning begins (initial warm-up)", low=0, high=1)
    end: float = option(0.7, "share of the steps at which the target sparsity is reached", low=0, high=1)
    scores_lr_scale: float = option(100.0, "movement: scores' lr = lr x this (the reference: 1e-2 vs 3e-5)",
                                    low=0, high=1e6, open_low=True)
    soft_lambda: float = option(400.0, "soft-movement: the L1 penalty's final weight (final_lambda)",
                                low=0, high=1e9)

    def __post_init__(self) -> None:
        check_options(self)
        for name in ("method", "sparsity"):
            if getattr(self, name) is None:
                raise OptionsError(f"{name} is required (no default)", name)
        if self.start > self.end:
            raise OptionsError(f"need start <= end, got start={self.start}, end={self.end}", "start")
        unread = [name for name, readers in READ_BY.items() if self.method not in readers]
        refuse_changed(self, unread, lambda name: f"only {' and '.join(READ_BY[name])} pruning reads it, "
                                                  f"not {self.method}; drop it")

    @classmethod
    def from_dict(cls, data: dict) -> SparseConfig:
        """Build from a dict; an unknown key is an error naming it."""
        return options_from_dict(cls, data, "pruning")


class Pruning(Objective):
    """A task trained under a Pruner: the schedule advances with the optimiser step."""

    def __init__(self, task, pruner: Pruner, accumulation: int = 1) -> None:
        super().__init__(task.model, task.pad_id)
        # the task's weights are self.model's: kept unregistered so checkpoints hold them once
        object.__setattr__(self, "task", task)
        self.pruner, self.accumulation = pruner, accumulation
        self.name = f"{task.kind} ({pruner.method} pruning)"
        # micro-batches seen in training: a buffer, so a resumed run continues the schedule
        self.register_buffer("micro", torch.zeros((), dtype=torch.long))

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        """The task's examples as they are."""
        return self.task.corrupt(example, generator)

    def collate(self, examples: list) -> dict:
        """The task's batches."""
        return self.task.collate(examples)

    def forward(self, batch: dict) -> Loss:
        """The task's loss under the masks of this step's sparsity."""
        if self.training:
            sparsity = self.pruner.at(int(self.micro) // self.accumulation)
            self.micro += 1
        else:
            sparsity = float(self.pruner.masks()[0][1].sparsity)
        out = self.task.forward(batch)
        penalty = self.pruner.penalty() if self.training else None
        # the task's count kept: a token-level loss weighs its step's tokens alike (the same penalty is in
        # every micro-batch, so their weighted mean adds it once)
        if penalty is None:
            return Loss(out.loss, {**out.metrics, "sparsity": torch.tensor(sparsity)}, out.count)
        return Loss(out.loss + penalty, {**out.metrics, "sparsity": torch.tensor(sparsity),
                                         "task_loss": out.loss.detach(), "l1_penalty": penalty.detach()},
                    out.count)

    def heads(self) -> dict:
        """The task's head."""
        return self.task.heads()

    def finish(self):
        """The model with the masks baked into its weights, its head attached."""
        self.pruner.bake()
        return self.task.finish()


def _settings(model, steps: int, task_cfg: TaskConfig, sparse_cfg: SparseConfig) -> dict:
    """What a run is pruned with, by the option that sets it: --model, --sparsity, --steps (the schedule
    spans them), key=value ones."""
    source = Path(model).resolve() if isinstance(model, (str, Path)) and Path(model).exists() else model
    return {"--model": str(source), "--sparsity": sparse_cfg.sparsity, "--steps": steps,
            **{f"{k}=": getattr(sparse_cfg, k) for k in SCHEDULE},
            # the task options that change what is trained, as fine-tuning records them (a rerank loss too)
            **{f"{k}=": value for k, value in trained_settings(task_cfg).items()}}


def check_settings(out: Path, settings: dict, resume: bool) -> bool:
    """A resumed run's settings are the run's (a ValueError naming the first option that differs, with
    both values); whether they are a fresh run's, to be written by record_settings once the run's other
    checks pass (not where checkpoints wait for --resume). Called once per run, before any read."""
    path, held = out / SETTINGS, checkpoints(out / "checkpoints")
    # by the checkpoints held, not the folder: a first save killed leaves checkpoints/ with none, and the
    # next fresh run must record its own settings, not leave the killed run's to be resumed against
    if resume and (path.is_file() or held):
        run = read_settings(path)
        for option, value in settings.items():
            if option in run and run[option] != value:
                shown = f"{option}{value}" if option.endswith("=") else f"{option} {value}"
                was = f"{option}{run[option]}" if option.endswith("=") else f"{option} {run[option]}"
                raise ValueError(f"{shown} differs from the run being resumed in {out} ({was}): resume with "
                                 f"the run's settings, or choose another out (--out)")
        return False
    return not held


def record_settings(out: Path, settings: dict) -> None:
    """A fresh run's settings (check_settings said so) written to out/SETTINGS with their checksum."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / SETTINGS, json.dumps(sign(settings, STATE_KEY), indent=2) + "\n")


def read_settings(path: Path) -> dict:
    """The settings a run wrote to `path`, verified by their checksum: missing, not JSON or changed is a
    ValueError naming the file (a resume cannot be checked against settings it cannot trust)."""
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: the run's pruning settings cannot be read ({err}); a resume is checked "
                         f"against them: choose another out (--out)") from None
    # never optional: a resume is only as sure as the settings it is checked against
    return verify(run, STATE_KEY, path,
                  what="the run's pruning settings do not match their checksum (changed or damaged); choose "
                       "another out (--out)")


def schedule_steps(cfg: SparseConfig, steps: int) -> tuple:
    """The cubic schedule's (start, end) optimiser steps over a run of `steps`; an OptionsError naming end
    where the run ends before a step trains at the full sparsity (the saved model would be less sparse
    than asked, and the shortfall read as rounding)."""
    start, end = round(cfg.start * steps), round(cfg.end * steps)
    reached = max(end, start + 1)  # steps count from 0; at start itself the sparsity is still 0
    if reached > steps - 1:
        raise OptionsError(f"end={cfg.end} (start={cfg.start}) of {steps} step(s): sparsity {cfg.sparsity} "
                           f"is reached at step {reached}, after the run's last step ({steps - 1}), so the "
                           f"model would end less sparse; give more steps or a smaller end", "end")
    return start, end


def _task_options(train_cfg: TrainConfig, task_cfg: TaskConfig | None, valid) -> TaskConfig:
    """The run's TaskConfig (keep_best off), after an OptionsError naming a setting of validation given with
    nothing to validate (as finetune refuses it) or an option of UNREAD: refused, never ignored (freezing
    and layer-wise decay were taken and ignored unsaid)."""
    check_validated(train_cfg, instance_of(task_cfg, TaskConfig, "task_cfg") or TaskConfig(), valid)
    task_cfg = TaskConfig.from_dict({**(task_cfg.__dict__ if task_cfg else {}), "keep_best": False})
    refuse_changed(task_cfg, UNREAD, "a fine-tuning option that pruning during fine-tuning does not read (it "
                   "trains every block at one rate)")
    return task_cfg


def prune_finetune(model, kind: str, train: list, valid: list | None, out, *, train_cfg: TrainConfig,
                   sparse_cfg: SparseConfig, task_cfg: TaskConfig | None = None, tokenizer=None,
                   resume: bool = False, log=print) -> dict:
    """Fine-tune `model` on `train` while pruning its block Linears by sparse_cfg's method to its
    sparsity; writes metrics.jsonl, checkpoints/ and final/ (masks baked) under `out`; returns the summary."""
    instance_of(train_cfg, TrainConfig, "train_cfg", False)  # options objects, not dicts of their fields
    instance_of(sparse_cfg, SparseConfig, "sparse_cfg", False)  # task_cfg's is _task_options' first check
    if train_cfg.parallel == "fsdp":  # FSDP shards the weights and scores: a matrix's top-k needs it whole
        raise ValueError("parallel=fsdp: pruning during fine-tuning ranks whole matrices; use parallel=ddp")
    task_cfg, s, out = _task_options(train_cfg, task_cfg, valid), sparse_cfg, run_folder(out, resume)
    # Python's records read as a file's, as finetune reads them: an error names train or validation
    train, valid = given_records(train, kind, "train"), valid and given_records(valid, kind, "validation")
    steps = train_cfg.for_data(len(train))[0].steps if train_cfg.epochs is not None else train_cfg.steps
    (start, end), settings = schedule_steps(s, steps), _settings(model, steps, task_cfg, s)  # no write yet
    fresh = check_settings(out, settings, resume)  # a resume with others: refused before any read, once
    # the folder's label order and activation where the options leave them, as finetune reads them (a
    # classifier's outputs keep their meaning; a sigmoid regression trains BCE)
    source_labels, trained = checkpoint_defaults(model, kind, train, None, task_cfg)
    model, tokenizer = load_model(model, tokenizer, seed=train_cfg.seed)
    with torch.random.fork_rng(devices=[]):  # a fresh head is drawn from the run's seed, as finetune's
        torch.manual_seed(derive_seed(train_cfg.seed, HEAD_SEED))
        task = make_task(kind, model, tokenizer, train, trained, source_labels)
    pruner = Pruner(model, s.method, s.sparsity, start, end, s.soft_lambda)
    objective = Pruning(task, pruner, train_cfg.accumulation)
    validator = Validator(task, valid, task_cfg, out) if valid else None
    start = time.perf_counter()
    examples = encode_split(task, train, "training", trained="training")  # its labels checked as trained on
    if fresh:  # written once the task, its options and records are checked too
        record_settings(out, settings)
    trainer = Trainer(objective, examples, train_cfg, out, log=log, evaluator=validator,
                      lr_scale=lambda name, p: s.scores_lr_scale if is_score(name) else 1.0)
    trainer.fit(resume=resume, final_files=(partial(write_task_files, task),))
    summary = {"task": kind, "method": s.method, "sparsity": s.sparsity, "steps": trainer.step,
               "seed": trainer.cfg.seed, "seconds": round(time.perf_counter() - start, 2),
               **weight_sparsity(model)}
    if validator is not None:
        summary["final"] = task.evaluate(valid, task_cfg.eval_batch_size, validator.examples)[1]
    if trainer.main:
        atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def _source_task(model_dir, kind: str, records: list, after, seed: int):
    """The source as the run began, not fine-tuned for `kind`: its backbone (a preset: drawn from
    `seed`, as the run's) under a fresh head of the pruned model's labels, drawn as the run drew its
    own. Its size and time are measured; its metric would be a random head's and is not."""
    model, tokenizer = load_model(model_dir, seed=seed)
    fields = TaskConfig.__dataclass_fields__
    cfg = TaskConfig.from_dict({k: v for k, v in after.info().items() if k in fields})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, HEAD_SEED))
        return make_task(kind, model, tokenizer, records, cfg, after.labels).to(after.device)


def run_sparse_prune(model_dir, kind: str, train: list, valid: list | None, records: list, out, *,
                     train_cfg: TrainConfig, sparse_cfg: SparseConfig, task_cfg: TaskConfig | None = None,
                     resume: bool = False, log=print) -> dict:
    """`lmforge prune --method magnitude|movement`: fine-tune with pruning, then measure the source and
    the pruned model side by side on `records` (the source's metric only where it was fine-tuned for
    the task); prune.json."""
    one_process("run_sparse_prune")
    # never the model read
    out = training_folder(output_folder(out, resolve_dir(model_dir), SPARSE_WRITES, "model_dir"))
    records = given_data(records, kind)  # before the training run, not after it
    summary = prune_finetune(model_dir, kind, train, valid, out, train_cfg=train_cfg, sparse_cfg=sparse_cfg,
                             task_cfg=task_cfg, resume=resume, log=log)
    after = fine_tuned_task(out / "final", records, kind)
    found = resolve_dir(model_dir)
    info = task_info(found) if found is not None else {}
    # a reference head read as several kinds (a CrossEncoder's one output: rerank or regression) is trained
    tuned = fine_tuned_for(info, kind)
    before = (fine_tuned_task(model_dir, records, kind) if tuned
              else _source_task(model_dir, kind, records, after, train_cfg.seed))
    measured = measure_side_by_side({"before": before, "after": after}, records,
                                    {"before": model_dir, "after": out / "final"})
    if not tuned and before.head != "lm":  # text-to-text: the pretrained LM head scores as it is
        note = f"not fine-tuned for {kind}: a fresh head's metric is not reported; size and time are measured"
        measured["before"].update(metric=None, metric_note=note)
    if found is None:
        measured["before"]["bytes"] = None  # a preset: no file on disk
    ws = weight_sparsity(after.model)
    report = {"method": sparse_cfg.method, "sparsity": sparse_cfg.sparsity,
              "achieved_sparsity": ws["sparsity"], "metric_name": measured["after"]["metric_name"],
              "steps": summary["steps"], "seed": summary["seed"],
              "train_seconds": summary["seconds"], **measured, "weight_sparsity": ws,
              "kept_by_matrix": kept_by_matrix(after.model), "note": NOTE}
    atomic_write_text(out / "prune.json", json.dumps(report, indent=2) + "\n")
    return report
