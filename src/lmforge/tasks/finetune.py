"""Fine-tuning (BERT sec. 4; "pretrain once, fine-tune many times"): a pretrained model, a task, labelled
records -> the one training loop, validation metrics every N steps, early stopping, the best model kept.

Under `out`: metrics.jsonl (train loss and valid_* metrics), checkpoints/, best/ (the model of the best
validation score), final/ (the model after the last step) and summary.json. best/ and final/ are complete
model directories: weights, the tokenizer, and task.json (kind, labels, max_len; for an encoder-decoder
also text_to_text and its prefix; QA's window and decoding options, tagging's label_all, regression's and
rerank's activation), so `lmforge evaluate --model out/best` needs nothing else.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Optional

import torch

from lmforge.config import atomic_write_text, option
from lmforge.config.options import OptionsError, check_options, checked_as, coerce, instance_of
from lmforge.fast.optimize import optimize
from lmforge.io import find_model_dir, find_tokenizer, load, model_dir, save
from lmforge.io.labels import ACTIVATIONS
from lmforge.model import from_config
from lmforge.presets import PRESETS, get_config
from lmforge.tasks.base import Task, check_read, check_validated, task_class
from lmforge.tasks.control import freeze, lr_scale_fn, trainable_count
from lmforge.tasks.fields import given_records, record_list, training_records
from lmforge.tasks.formats import check_labels, gold_given, source_of, write_predictions
# task_info is named here too: the jobs and commands import it from this module
from lmforge.tasks.reference import (ONE_SCORE, check_head, check_kind, check_scored, default_labels,
                                     fine_tuned_for, own_kind, saved_kind, saved_options, scored_activation,
                                     task_info)
from lmforge.tasks.rerank import rerank_option
from lmforge.tokenizer import check_fits, load_tokenizer
from lmforge.train import TrainConfig, Trainer
from lmforge.train.config import check_device, check_ranks, options_from_dict
from lmforge.train.data import data_change, data_fingerprint, derive_seed
from lmforge.train.distributed import from_root
from lmforge.train.loop import resolve_device
from lmforge.train.run_folder import run_folder
from lmforge.utils.apart import refuse_writing_over
from lmforge.utils.atomic import replace_dir
from lmforge.utils.model_folder import record_sums

TASK_FILE = "task.json"
# derive_seed streams of the run's seed (train/data.py and train/loop.py use 1-3): a fresh task
# head's initialisation, and a preset's random initialisation (load_model)
HEAD_SEED, PRESET_SEED = 4, 5
MAX_PREFIX = 1000  # characters of a text-to-text task prefix
# TaskConfig options read only when evaluating or deciding to stop: a resumed run may change them
EVALUATION = ("patience", "keep_best", "eval_batch_size", "n_best", "max_answer_len", "null_threshold",
              "num_beams", "max_new_tokens", "threshold")
MAX_TASK_LEN = 65536  # tokens of one example: a checkpoint's own context may be longer (131,072)
ELMO_REFUSAL = ("ELMo is fine-tuned feature-based (frozen layers, a scalar mix and a head): lmforge features "
                "--model DIR --task tagging|classification --train FILE --dev FILE")


@dataclass
class TaskConfig:
    """Fine-tuning options beyond the training loop's: length, freezing, LLRD, early stopping."""

    max_len: int = option(128, "tokens per example (longer ones are truncated)", low=1, high=MAX_TASK_LEN)
    freeze_embeddings: bool = option(False, "keep the embeddings fixed")
    freeze_layers: int = option(0, "keep the first k blocks fixed", low=0, high=10_000)
    freeze_backbone: bool = option(False, "train the head only (feature-based use)")
    layer_decay: float = option(1.0, "layer-wise lr decay: each layer down from the top multiplies lr by it; "
                                "1: off", low=0, high=1, open_low=True)
    patience: int = option(0, "evaluations without a better primary metric before stopping; 0: never",
                           low=0, high=10 ** 6)
    keep_best: bool = option(True, "write OUT/best at every new best validation score")
    eval_batch_size: int = option(64, "examples per batch when evaluating", low=1, high=65536)
    # encoder-decoders on cls / pair / regression (tasks/text2text.py): True casts the task as text (T5),
    # False uses the classification head (BART's); None: the head where the reference has one, else text
    text_to_text: Optional[bool] = option(None, "encoder-decoders: true (as text), false (head), null: auto")
    prefix: Optional[str] = option(None, "text-to-text task prefix (\"sst2\"); null: the task kind "
                                   "(seq2seq: no prefix)")
    # extractive QA (tasks/qa.py QATask): windows over long contexts and answer decoding
    doc_stride: Optional[int] = option(None, "qa: tokens shared by consecutive windows; null: max_len // 3",
                                       low=1, high=65536)
    max_query_len: Optional[int] = option(None, "qa: question tokens kept; null: min(64, max_len // 2)",
                                          low=1, high=65536)
    n_best: int = option(20, "qa: start and end candidates paired per window", low=1, high=1000)
    max_answer_len: int = option(30, "qa: longest answer, in tokens", low=1, high=65536)
    unanswerable: Optional[bool] = option(None, "qa: null answers; null: on once a record has none (SQuAD 2)")
    null_threshold: float = option(0.0, "qa: how much the null score must beat the best span's",
                                   low=-1e6, high=1e6)
    threshold: float = option(0.5, "multilabel: a label is predicted where its sigmoid exceeds it",
                              low=0, high=1, open_low=True, open_high=True)
    # tagging (tasks/tagging.py): train on every sub-word's label, not only the first sub-word's
    label_all: bool = option(False, "tagging: train on every sub-word's label, not only the first's")
    # seq2seq (tasks/seq2seq.py): generation at evaluation; num_beams 1 is greedy
    num_beams: int = option(1, "seq2seq: beams when generating at evaluation; 1: greedy", low=1, high=64)
    max_new_tokens: int = option(64, "seq2seq: most tokens generated per example at evaluation",
                                 low=1, high=65536)
    # regression and rerank (tasks/classify.py, tasks/rerank.py): how their one output is read as a score
    activation: Optional[str] = option(None, "regression, rerank: the score is sigmoid(logit) (regression "
                                       "trains BCE on labels in [0, 1]) or the logit (identity; MSE); "
                                       "null: the model folder's (a CrossEncoder's), else identity (rerank: "
                                       "sigmoid)",
                                       choices=ACTIVATIONS)
    # rerank (tasks/rerank.py): declared once there, in RerankOptions
    loss: str = rerank_option("loss")
    negatives: int = rerank_option("negatives")
    distill: str = rerank_option("distill")
    temperature: float = rerank_option("temperature")

    def __post_init__(self) -> None:
        if self.text_to_text == "auto":
            self.text_to_text = None
        for f in dataclasses.fields(self):  # key=value's "true"/"false"; "maybe" is refused, not read as true
            setattr(self, f.name, coerce(TaskConfig, f.name, getattr(self, f.name), OptionsError))
        check_options(self)
        if self.prefix is not None and len(self.prefix) > MAX_PREFIX:
            raise OptionsError(f"prefix must be at most {MAX_PREFIX} characters, got {len(self.prefix)}",
                               "prefix")

    @classmethod
    def from_dict(cls, data: dict) -> "TaskConfig":
        """Build from a dict; an unknown key is an error naming it."""
        return options_from_dict(cls, data, "fine-tuning")


def preset_model(name: str, tokenizer, overrides: dict | None = None, seed: int = 0):
    """Preset `name` sized to the tokenizer, its init from `seed` (PRESET_SEED), not the caller's RNG."""
    if tokenizer is None:
        raise OptionsError(f"preset {name!r} needs a tokenizer (tokenizer=, --tokenizer DIR)", "tokenizer")
    config = get_config(name, **{"vocab_size": tokenizer.vocab_size, **(overrides or {})})
    with torch.random.fork_rng(devices=[]):  # the model is built on the CPU
        torch.manual_seed(derive_seed(seed, PRESET_SEED))
        return from_config(config)


def load_model(model, tokenizer=None, overrides: dict | None = None, seed: int = 0) -> tuple:
    """(model, tokenizer) from a model object, an lmforge / Hugging Face directory or model package
    (its tokenizer unless one is given) or a preset name (random init from `seed`, sized to the
    tokenizer: see preset_model)."""
    if isinstance(tokenizer, (str, Path)):  # an installed model's name too, as --model takes it
        tokenizer = find_tokenizer(tokenizer)
    if isinstance(model, (str, Path)):
        path = model_dir(model)
        if path is not None:
            model, tokenizer = load(path), tokenizer or load_tokenizer(path)
        elif str(model) in PRESETS:
            model = preset_model(str(model), tokenizer, overrides, seed)
        else:  # a name: said as given, on every face (the command line's --model is this argument)
            raise OptionsError(f"model {str(model)!r} is neither a model directory, an installed model nor a "
                               f"preset name", "model")
    elif not isinstance(model, torch.nn.Module):
        raise OptionsError(f"model must be a model, a model directory or a preset name, got "
                           f"{type(model).__name__}", "model")
    if tokenizer is None:
        raise OptionsError("a tokenizer is needed next to a model object", "tokenizer")
    check_fits(tokenizer, model)  # ids the model lacks would index past its embeddings
    return optimize(model), tokenizer  # the fine-tuning and evaluation jobs run it optimized


def save_model(task: Task, path, state: dict | None = None) -> Path:
    """Write the task's model (`state`: its weights gathered from several processes), its tokenizer and
    task.json into the directory `path` (a folder being staged; keep_model puts one in place whole)."""
    save(task.model, path, state=state)
    write_task_files(task, path)
    return Path(path)


def write_task_files(task: Task, path) -> None:
    """The task's tokenizer and task.json, beside its saved model in the directory `path`."""
    task.tokenizer.save(path)
    atomic_write_text(Path(path) / TASK_FILE, json.dumps(task.info(), indent=2, ensure_ascii=False) + "\n")
    record_sums(path, [TASK_FILE])  # task_info verifies it


def keep_model(task: Task, path, state: dict | None = None) -> Path:
    """save_model into a staged folder put in the place of `path` whole: a kill leaves the folder that was
    there (or none), never a part of one, and a link named `path` is replaced, not written through."""
    replace_dir(path, lambda folder: save_model(task, folder, state))
    return Path(path)


def encode_split(task: Task, records: list, source: str, *, trained: str | None = None) -> list:
    """Examples of a split; an encoding error names where the records came from (Records.source), else the
    split's `source`, and is blamed on the argument they came in (Records.field: none for a file's or a plain
    list). A run's own records (trained="training" or "validation") are checked as trained on (a sigmoid
    regression's labels in [0, 1], distillation's teacher scores), before any step; evaluated data not."""
    try:
        if trained:
            task.check_trainable(records, trained)
        return task.encode_all(records)
    except ValueError as err:
        raise OptionsError(f"{source_of(records, source)}: {err}", getattr(records, "field", None)) from None


class Validator:
    """The Trainer's evaluator: validation metrics, best/ kept, {"stop": True} once patience runs out."""

    def __init__(self, task: Task, records: list, cfg: TaskConfig, out: Path, log=None) -> None:
        self.task, self.records, self.cfg, self.out = task, records, cfg, out
        self.examples = encode_split(task, records, "validation", trained="validation")
        self._fingerprint = None
        task.say_cut(len(records), "validation", log)
        self.best, self.best_step, self.stale, self.last, self.last_step = None, 0, 0, {}, -1

    def fingerprint(self) -> dict:
        """The validation examples' data_fingerprint (train/data.py), computed once."""
        if self._fingerprint is None:
            self._fingerprint = data_fingerprint(self.examples)
        return self._fingerprint

    def state_dict(self) -> dict:
        """The best score, its step, the evaluations since and the validation data's fingerprint: JSON
        for the trainer's checkpoints."""
        return {"best": self.best, "best_step": self.best_step, "stale": self.stale,
                "last": self.last, "last_step": self.last_step, "validation": self.fingerprint()}

    def check_state(self, state: dict) -> None:
        """ValueError where a checkpoint's state_dict() was validated on other data: its best score would
        be compared with scores on this set (checkpoints from before fingerprints pass)."""
        change = data_change(state.get("validation"), self.fingerprint())
        if change is not None:
            raise ValueError(f"cannot resume {self.out}: it was validated on other data ({change}), and "
                             "its best score and patience were counted there; resume with the run's "
                             "validation data or choose another out (--out)")

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint's state_dict() (a resumed run), checked first (check_state)."""
        self.check_state(state)
        self.best, self.best_step, self.stale = state["best"], state["best_step"], state["stale"]
        self.last, self.last_step = state["last"], state["last_step"]

    def stops(self) -> bool:
        """Whether patience (as given now: a resume may change it) has run out."""
        return bool(self.cfg.patience and self.stale >= self.cfg.patience)

    def __call__(self, trainer) -> dict:
        """Evaluate now (trainer.step); returns valid_* metrics (and "stop" when patience ran out)."""
        _, metrics = self.task.evaluate(self.records, self.cfg.eval_batch_size, self.examples)
        # every rank decides on rank 0's scores: ranks whose own differ (GPU nondeterminism, in the last bit)
        # would part at keep_best's gather or at an early stop, and the other hang in its next collective
        metrics = from_root(metrics)
        self.last, self.last_step = metrics, trainer.step
        primary = next(iter(metrics))
        if self.best is None or metrics[primary] > self.best[primary]:
            self.best, self.best_step, self.stale = metrics, trainer.step, 0
            if self.cfg.keep_best:  # every rank joins the gather of the weights (FSDP), rank 0 writes
                trainer.write_model(partial(keep_model, self.task, self.out / "best"))
        else:
            self.stale += 1
        found = {f"valid_{k}": v for k, v in metrics.items()}
        if self.stops():
            trainer.log(f"early stop at step {trainer.step}: no better valid_{primary} for {self.stale} "
                        f"evaluations (best {self.best[primary]:.4f} at step {self.best_step})")
            found["stop"] = True
        return found


def make_task(kind: str, model, tokenizer, train: list, cfg: TaskConfig, labels: list | None = None) -> Task:
    """The Task of `kind` around `model` (a head, or text-to-text: TaskConfig); labels given, or train's."""
    from lmforge.tasks import text2text

    text = text2text.choose(kind, model, cfg.text_to_text)
    cls = text2text.CLASSES[kind] if text else task_class(kind)
    labels = labels if labels is not None else cls.labels_from(train)
    read = ("prefix",) if text else cls.options
    check_read(kind if not text else f"text-to-text {kind}", read, cfg, model.config)
    return cls(model, tokenizer, labels=labels, max_len=cfg.max_len, **{n: getattr(cfg, n) for n in read})


def trained_settings(cfg: TaskConfig) -> dict:
    """The options of `cfg` that decide a run's updates (all but those of evaluation and early stopping):
    recorded in its checkpoints, so a resume with another (freeze_layers, a rerank loss) is refused."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in EVALUATION}


def checkpoint_defaults(model, kind: str, train: list, labels: list | None, cfg: TaskConfig) -> tuple:
    """(labels, cfg) with what a model directory says where the caller says nothing: its label order where the
    training records use the very same labels, so its trained head goes on with the meaning of each output
    (as the reference's run_glue reads a checkpoint's label2id; else None: the records' sorted labels, a fresh
    head where they differ), and the activation of a folder of the same kind or a CrossEncoder's (its output
    goes on being read, and trained, as sentence-transformers reads it)."""
    labelled = labels is None and kind in ("cls", "pair", "tagging", "multilabel")  # outputs named by labels
    scored = cfg.activation is None and kind in ONE_SCORE
    # a loaded model stands for its folder (the command line loads it before fine-tuning: it had read nothing)
    source = model if isinstance(model, (str, Path)) else getattr(model, "loaded_from", None)
    path = model_dir(source) if source is not None and (labelled or scored) else None
    info = task_info(path) if path is not None else {}
    # another kind's is not the run's: a reranker's sigmoid would refuse a regression's labels past 1, a plain
    # regressor's identity would make a reranker score raw logits
    same = fine_tuned_for(info, kind) or info.get("cross_encoder")
    if scored and same and info.get("activation"):
        cfg = dataclasses.replace(cfg, activation=scored_activation(path, info))
    known = info.get("labels") or [str(i) for i in range(info.get("outputs") or 0)]  # no id2label: class ids
    data = task_class(kind).labels_from(train) if known and labelled else None
    if data is not None and len(known) == len(data) and set(known) == set(data):
        labels = list(known)
    return labels, cfg


def finetune(model, tokenizer, kind: str, train: list, valid: list | None, out, train_cfg: TrainConfig,
             task_cfg: TaskConfig | None = None, labels: list | None = None, resume: bool = False,
             log=print) -> dict:
    """Fine-tune `model` (object, directory or preset: its init drawn from train_cfg.seed) on `train` records
    of task `kind`, validating on `valid`; writes under `out` (the module docstring); returns the summary."""
    check_ranks(instance_of(train_cfg, TrainConfig, "train_cfg", False))  # torchrun: parallel=none, no GPU
    train = training_records(kind, train)  # an unknown kind, or no records: refused before any work
    task_cfg = instance_of(task_cfg, TaskConfig, "task_cfg") or TaskConfig()  # a dict is refused, not read
    out = run_folder(out, resume, model=model, tokenizer=tokenizer)  # never an input, nor a run not resumed
    check_validated(train_cfg, task_cfg, valid)  # a setting of validation, with no records to validate
    # Python's records as a file's are read (a dataset's integer class ids become the labels "0", "1", ...)
    train, valid = given_records(train, kind, "train"), valid and given_records(valid, kind, "validation")
    labels, task_cfg = checkpoint_defaults(model, kind, train, labels, task_cfg)
    model, tokenizer = load_model(model, tokenizer, seed=train_cfg.seed)
    if model.config.architecture == "elmo":  # a biLSTM over characters, used by its frozen layers' mix
        raise OptionsError(ELMO_REFUSAL, "model")
    with torch.random.fork_rng(devices=[]):  # a fresh head is drawn from the run's seed, not the caller's RNG
        torch.manual_seed(derive_seed(train_cfg.seed, HEAD_SEED))
        task = make_task(kind, model, tokenizer, train, task_cfg, labels)
    if valid and task.labels is not None and kind in ("cls", "pair"):
        check_labels(valid, task.labels, "validation", field="validation")
    frozen = freeze(model, task_cfg.freeze_embeddings, task_cfg.freeze_layers, task_cfg.freeze_backbone)
    examples = encode_split(task, train, "training", trained="training")
    task.say_cut(len(train), "training", log)
    validator = Validator(task, valid, task_cfg, out, log) if valid else None
    start = time.perf_counter()
    trainer = Trainer(task, examples, train_cfg, out, log=log, evaluator=validator,
                      lr_scale=lr_scale_fn(model, task_cfg.layer_decay), settings=trained_settings(task_cfg))
    trainer.fit(resume=resume, final_files=(partial(write_task_files, task),))
    seconds = time.perf_counter() - start
    if validator is not None and validator.last_step != trainer.step:
        trainer.run_evaluator()  # the final model's score (and best/ if it is the best)
    summary = {"task": kind, "steps": trainer.step, "seed": trainer.cfg.seed, "seconds": round(seconds, 2),
               "frozen_parameters": frozen, "trainable_parameters": trainable_count(model)}
    if validator is not None:
        summary.update(primary=next(iter(validator.last)), final=validator.last, best=validator.best,
                       best_step=validator.best_step, stopped_early=trainer.step < trainer.cfg.steps)
    if trainer.main:
        atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def fine_tuned_task(model, records: list, kind: str | None = None, tokenizer=None, labels: list | None = None,
                    max_len: int | None = None, batch_size: int = 64, device: str = "auto") -> Task:
    """The Task of a fine-tuned model (object or directory: its task.json gives kind, labels,
    max_len and decoding options), refusing a model that has no head of that task."""
    check_device(device)  # before the model is read: a name torch does not know is refused, not a crash
    batch_size = checked_as(TaskConfig, "eval_batch_size", batch_size, "batch_size")
    where = str(model) if isinstance(model, (str, Path)) else "the model"
    if isinstance(model, (str, Path)) and str(model) not in PRESETS:  # a preset is drawn by load_model
        find_model_dir(model)  # a name of no model: lmforge.load's CheckpointError, not "no task.json"
    path = (model_dir(model) or model) if isinstance(model, (str, Path)) else None
    info = task_info(path) if path is not None else {}
    kind = kind or own_kind(info)
    if kind is None:  # a reference head read as one of several tasks ("kinds"): the caller says which
        why = f"may be read as {' or '.join(info['kinds'])}" if info.get("kinds") else "has no task.json"
        raise OptionsError(f"the task kind is needed (kind=; --task on the command line): {where} {why}",
                           "kind")
    check_kind(where, info, kind)  # task.json's kind, or a Hugging Face head's meaning (its problem_type)
    check_scored(path, info, kind)  # a CrossEncoder's Tanh: refused before its weights are read
    check_head(path, info, kind, where)  # as is a folder whose config.json has no head of the task
    folder, (model, tokenizer) = isinstance(model, (str, Path)), load_model(model, tokenizer)
    # a folder without task.json (a Hugging Face one) reads to its context, as the reference's pipelines
    default = min(model.config.max_seq_len, MAX_TASK_LEN) if folder else 128
    given = {"eval_batch_size": batch_size, **({} if max_len is None else {"max_len": max_len})}
    cfg = TaskConfig(**{**saved_options(path, info, kind, default), **given})
    labels = labels if labels is not None else info.get("labels")  # given, else task.json's / id2label
    pretrained = {id(head) for head in model.heads.values()}
    if labels is None:  # the last resort, the data's own labels: read as a file's are
        records = given_records(records, kind, "data", labelled=False)  # (a reference's class ids: unnamed)
        labels = default_labels(where, info, task_class(kind).labels_from(records))
    task = make_task(kind, model, tokenizer, records, cfg, labels).to(resolve_device(device))
    if task.head != "lm" and id(task.task_head) not in pretrained:  # a head the model lacked: freshly drawn
        raise ValueError(f"{where} was never fine-tuned for {kind}: it has no {task.head} head to match "
                         f"(no task.json of that task), so its scores would be a random head's; fine-tune "
                         f"it first (lmforge finetune --task {kind})")
    return task


def evaluate(model, records: list, kind: str | None = None, tokenizer=None, labels: list | None = None,
             out=None, max_len: int | None = None, batch_size: int = 64, device: str = "auto",
             log=None) -> dict:
    """Metrics of a fine-tuned model (object or directory, whose task.json gives kind, labels and max_len) on
    labelled `records`; predictions written to `out` (JSONL) when given. Records without labels get only
    predictions ({} metrics). `log` (default: standard error) is told of records cut to max_len tokens."""
    refuse_writing_over(out, ("model", model), ("tokenizer", tokenizer),  # never a file of the model read
                        models=("model", "tokenizer"))
    records, known = record_list(records, "data"), saved_kind(model, kind)  # a generator is read once, here
    # each record checked before the model is loaded, by the kind its folder says (none: checked after)
    records = given_records(records, known, "data", labelled=False) if known is not None else records
    labelled = gold_given(records, "data", field="data")
    task = fine_tuned_task(model, records, kind, tokenizer, labels, max_len, batch_size, device)
    records = given_records(records, task.kind, "data", labelled=False)  # as fine_tuned_task read them
    examples = encode_split(task, records, "data")
    task.say_cut(len(records), "evaluated", log)
    predictions = task.decode(records, examples, task.outputs(examples, batch_size))
    if out is not None:
        write_predictions(out, records, predictions)
    return task.score(records, predictions) if labelled else {}
