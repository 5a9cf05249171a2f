"""What every fine-tuning task provides: encoding, loss, batch prediction, decoding, metrics.

A `Task` is an `Objective` (objectives/base.py), so the one training loop trains it
unchanged. Its data side turns canonical records (tasks/formats.py) into examples;
its model side owns the task head:

- `encode(record)` -> the record's examples (token lists and ints; QA: one per window);
- `forward(batch)` -> `Loss` for training;
- `predict(batch)` -> one raw output per example, plain python (no gradients);
- `decode(records, examples, outputs)` -> one prediction per record;
- `score(records, predictions)` -> metrics, the primary metric first.

The task takes the model over: on creation its head is attached under `head` and every
other head is removed, so the fine-tuned model is the backbone plus the task head and
exports as e.g. BertForSequenceClassification. A pretrained pooler (BertModel's
"pooler", BertForPreTraining's "nsp") is reused by a fresh classification head, as the
reference library does when it loads a pretrained checkpoint into a task model.

Registry: each task module decorates its classes with `@register` (kind -> class);
`task_class(kind)` imports the module named in MODULES on first use, so a kind's
module is only needed when that kind is asked for.
"""
from __future__ import annotations

import abc
import importlib
import sys
from functools import partial

import torch
from torch import nn

from lmforge.config.options import OptionsError, refuse_changed
from lmforge.heads import make_head
from lmforge.io.labels import KIND_PROBLEM_TYPE, HeadLabels, exported_activation
from lmforge.objectives.base import Loss, Objective
from lmforge.quant.int8 import refuse_int8
from lmforge.utils.modes import evaluating

TASKS: dict = {}  # kind -> Task subclass, filled by @register
# kind -> the module of lmforge.tasks defining it
MODULES = {"cls": "classify", "pair": "classify", "regression": "classify", "choice": "classify",
           "multilabel": "classify", "tagging": "tagging", "qa": "qa", "seq2seq": "seq2seq",
           "rerank": "rerank"}
META = ("record",)  # example keys that never enter a batch


def notes(log=None):
    """Where a task's notes go: `log`, else standard error (a job's standard output holds its results)."""
    return log or partial(print, file=sys.stderr)


def register(cls: type) -> type:
    """Class decorator: make `cls` the Task of `cls.kind`."""
    TASKS[cls.kind] = cls
    return cls


def task_class(kind: str) -> type:
    """The Task class of `kind` (cls, pair, regression, choice, multilabel, tagging, qa, seq2seq, rerank)."""
    if kind not in MODULES:  # the argument (kind=; --task on the command line) named, as the others are
        raise OptionsError(f"task {kind!r} is not one of {', '.join(MODULES)}", "kind")
    if kind not in TASKS:
        importlib.import_module(f"lmforge.tasks.{MODULES[kind]}")
    return TASKS[kind]


def option_owners() -> dict:
    """TaskConfig option -> the kinds of task that read it (qa's doc_stride ...; a text-to-text task's
    prefix); the options not listed every task reads."""
    owners = {"prefix": ["text-to-text"]}
    for kind in MODULES:
        for name in task_class(kind).options:
            if kind not in owners.setdefault(name, []):
                owners[name].append(kind)
    return owners


def check_read(task: str, read: tuple, cfg, model_config=None) -> None:
    """An OptionsError naming the first option of another kind of task (qa's doc_stride, seq2seq's
    num_beams, rerank's loss, a text-to-text prefix ...) set in `cfg` (a TaskConfig) but not one the
    `task` reads: such an option is refused, never ignored; and max_len set past the positions of the model
    (of config `model_config`), which the task would cut to them unsaid (its default, 128, reads to a
    shorter model's context)."""
    owners = option_owners()  # name -> the kinds of task that read it
    refuse_changed(cfg, [name for name in owners if name not in read], lambda name: f"an option of "
                   f"{' and '.join(owners[name])} tasks; a {task} task does not read it")
    check_max_len(cfg, model_config)


def check_max_len(cfg, model_config=None) -> None:
    """An OptionsError naming max_len where `cfg` (a TaskConfig) sets it past the positions of the model of
    config `model_config` (None: nothing checked): fine-tuning's check (check_read), and a bake-off plan's
    before any arm pretrains. Its default, 128, is no refusal: it reads to a shorter model's context."""
    if model_config is not None and cfg.max_len > model_config.max_seq_len:
        refuse_changed(cfg, ("max_len",), f"more tokens than the model reads (max_seq_len="
                       f"{model_config.max_seq_len})")


def check_validated(train_cfg, task_cfg, valid=None) -> None:
    """An OptionsError naming a setting of validation (eval_every, patience, keep_best, eval_batch_size)
    changed from its default in a run (its TrainConfig, TaskConfig) without `valid` records, where nothing
    reads it: fine-tuning's check, distillation's and pruning's."""
    if valid:
        return
    why = "a setting of validation, and the run has no validation records (valid, --valid FILE) to evaluate"
    if train_cfg.eval_every:  # left out (null) or 0: no validation during training, as the run has none
        refuse_changed(train_cfg, ("eval_every",), why)
    refuse_changed(task_cfg, ("patience", "keep_best", "eval_batch_size"), why)


def _reusable_pooler(model: nn.Module):
    """A pretrained pooler among the model's heads (BertModel's own, or the NSP/SOP head's)."""
    for head in model.heads.values():
        if head.spec.get("kind") == "pooler":
            return head
    for head in model.heads.values():
        if getattr(head, "pooler", None) is not None:
            return head.pooler
    return None


class Task(Objective, abc.ABC):
    """Base class of the fine-tuning tasks; see the module docstring for the contract."""

    kind = "task"
    cut = 0  # records of the last encode_all that were longer than max_len tokens and cut (say_cut)
    _was_cut = False  # whether the record being encoded was cut (encode_capped; encode_all resets it)
    head = "classification"  # name (and kind) of the head in model.heads
    meta_keys: tuple = ()  # further example keys a subclass keeps out of batches (offsets, ...)
    options: tuple = ()  # constructor options (TaskConfig fields of the same name) kept in task.json
    cross_encoder = False  # a score read from a CrossEncoder's head (_name_outputs): its activation exported

    def __init__(self, model: nn.Module, tokenizer, labels: list | None = None, max_len: int = 128) -> None:
        pad = tokenizer.pad_id if tokenizer.pad_id is not None else tokenizer.eos_id
        super().__init__(model, pad_id=pad or 0)
        if model.config.architecture == "decoder" and model.config.pad_token_id is None:
            # the reference's decoder classifiers find the last real token by the pad id, so a model
            # exported for it needs one: the id this task pads with
            model.config = model.config.replace(pad_token_id=self.pad_id)
        self.tokenizer = tokenizer
        self.labels = list(labels) if labels is not None else None
        self.max_len = min(max_len, model.config.max_seq_len)
        self.task_head = self._take_over(model)
        self._name_outputs(self.task_head)

    @classmethod
    def labels_from(cls, records: list) -> list | None:
        """The label list a training split implies: its sorted tags or string labels (None for
        tasks without a label set: regression, choice, qa)."""
        if records and "tags" in records[0]:
            return sorted({t for r in records for t in r["tags"]})
        if records and isinstance(records[0].get("label"), str):
            return sorted({r["label"] for r in records if r.get("label") is not None})
        return None

    def head_args(self) -> dict:
        """Arguments of heads.make_head for this task's head (e.g. n_labels)."""
        return {}

    def info(self) -> dict:
        """What a fine-tuned model directory's task.json records to rebuild this task."""
        return {"kind": self.kind, "labels": self.labels, "max_len": self.max_len,
                **{name: getattr(self, name) for name in self.options},
                **({"cross_encoder": True} if self.cross_encoder else {})}

    def _take_over(self, model: nn.Module) -> nn.Module:
        fresh = make_head(model, self.head, **self.head_args())
        existing = model.heads[self.head] if self.head in model.heads else None
        if existing is not None and existing.spec == fresh.spec:
            head = existing  # a fine-tuned model's own head: keep it (evaluation, continued training)
        else:
            # a new head is for training, which an int8 model cannot do
            refuse_int8(model, f"it has no {self.head} head to run, and a new one cannot be trained on it: "
                               "fine-tune the fp32 model, then lmforge quantize it")
            head, pooler = fresh, _reusable_pooler(model)
            if getattr(head, "pooler", None) is not None and pooler is not None:
                head.pooler.dense.load_state_dict(pooler.dense.state_dict())
        for name in list(model.heads):
            del model.heads[name]
        model.add_head(self.head, head)
        return head

    def _name_outputs(self, head: nn.Module) -> None:
        """Keep this task's labels and problem_type on its classifier head (io/labels.py head_labels), so
        that lmforge.save(format="hf") of a model fine-tuned in Python names its outputs, not LABEL_i."""
        if "n_labels" not in head.spec:
            return
        n, known = head.spec["n_labels"], getattr(head, "head_labels", None)
        known = known if isinstance(known, HeadLabels) else None  # a kept head's, as it was loaded
        names = tuple(map(str, self.labels)) if self.labels and len(self.labels) == n else None
        if names is None and known is not None and known.names and len(known.names) == n:
            names = known.names  # a regressor's name of its score, as its folder said it
        # a kind the reference would misread says its own; another keeps a loaded one that is none of those
        problem = KIND_PROBLEM_TYPE.get(self.kind)
        if problem is None and known is not None and known.problem_type not in KIND_PROBLEM_TYPE.values():
            problem = known.problem_type
        # a CrossEncoder's activation, written back as its activation_fn (a plain regressor's none); a score
        # read from a CrossEncoder's head stays one, identity too, so sentence-transformers reads no sigmoid
        own = getattr(self, "activation", None)
        self.cross_encoder = own is not None and known is not None and known.cross_encoder
        activation = exported_activation({"kind": self.kind, "activation": own,
                                          "cross_encoder": self.cross_encoder})
        head.head_labels = (HeadLabels(names, problem, activation, self.cross_encoder)
                            if names or problem or activation else None)

    # ---- data side ----------------------------------------------------------------------------
    @abc.abstractmethod
    def encode(self, record: dict) -> list:
        """One record -> its examples (token lists and ints)."""

    def check_trainable(self, records: list, split: str = "training") -> None:
        """Refuse (ValueError naming the line) a record of a run's `split` ("training" or "validation") this
        task can score but not train on; none here."""

    def label_index(self, record: dict) -> int:
        """The gold label's position in `labels` (an error naming the record's line if unknown)."""
        index = getattr(self, "_index", None)
        if index is None:
            index = self._index = {label: i for i, label in enumerate(self.labels)}
        if record["label"] not in index:
            raise ValueError(f"line {record.get('line', '?')}: label {record['label']!r} is not one of "
                             f"the training labels {self.labels}")
        return index[record["label"]]

    def encode_all(self, records: list) -> list:
        """Every record's examples, each carrying "record": the record's position in `records`; `cut`
        counts the records cut to max_len tokens."""
        out, self.cut = [], 0
        for i, record in enumerate(records):
            self._was_cut = False
            for example in self.encode(record):
                example["record"] = i
                out.append(example)
            self.cut += self._was_cut
        return out

    def encode_capped(self, text: str, pair: str | None = None):
        """The tokenizer's encoding of a text (pair) cut to max_len tokens; a cut is counted (encode_all's
        `cut`), so that a job can say how many records the model read only in part."""
        enc = self.tokenizer.encode(text, pair, max_length=self.max_len)
        self._was_cut |= enc.truncated  # the tokens the cut left over: no second encoding to count them
        return enc

    def say_cut(self, n: int, what: str, log=None) -> None:
        """Tell `log` (default: standard error) how many of the `n` records (`what`: "training") that the
        last encode_all read were cut to max_len tokens; nothing when none was."""
        if self.cut:
            notes(log)(
                f"{self.cut} of {n} {what} records are longer than max_len={self.max_len} tokens and were "
                f"cut (the model reads only their first {self.max_len}); raise max_len to read more")

    def length(self, example: dict) -> int:
        """Tokens of an example (batches for prediction group similar lengths)."""
        return len(example["input_ids"])

    def collate(self, examples: list) -> dict:
        """Pad a batch, leaving out "record" and `meta_keys`; float scalars become a float tensor."""
        drop = set(META) | set(self.meta_keys)
        floats = {k for k, v in examples[0].items() if isinstance(v, float)}
        batch = super().collate([{k: v for k, v in e.items() if k not in drop | floats} for e in examples])
        for key in floats:
            batch[key] = torch.tensor([e[key] for e in examples], dtype=torch.float)
        return batch

    # ---- model side ---------------------------------------------------------------------------
    @abc.abstractmethod
    def forward(self, batch: dict) -> Loss:
        """A padded batch -> the training loss (and metrics to log)."""

    @abc.abstractmethod
    def predict(self, batch: dict) -> list:
        """A padded batch -> one raw output per example (plain python)."""

    @abc.abstractmethod
    def decode(self, records: list, examples: list, outputs: list) -> list:
        """Raw outputs of `examples` -> one prediction per record."""

    @abc.abstractmethod
    def score(self, records: list, predictions: list) -> dict:
        """Metrics of the predictions against the records' gold labels; the first key is primary."""

    def heads(self) -> dict:
        """The task head, by name (attached already; `finish` keeps it)."""
        return {self.head: self.task_head}

    @property
    def device(self) -> torch.device:
        """Where the model's weights are."""
        return next(self.model.parameters()).device

    @torch.no_grad()
    def outputs(self, examples: list, batch_size: int = 64) -> list:
        """Raw outputs of many examples, batch by batch, in eval mode (sorted by length so a
        batch pads little; returned in the examples' order)."""
        order = sorted(range(len(examples)), key=lambda i: self.length(examples[i]))
        out: list = [None] * len(examples)
        with evaluating(self):
            for start in range(0, len(order), batch_size):
                chunk = order[start:start + batch_size]
                batch = {k: v.to(self.device) for k, v in self.collate([examples[i] for i in chunk]).items()}
                for i, value in zip(chunk, self.predict(batch)):
                    out[i] = value
        return out

    def evaluate(self, records: list, batch_size: int = 64, examples: list | None = None) -> tuple:
        """(predictions, metrics) of the model on `records` (their examples encoded unless given)."""
        examples = self.encode_all(records) if examples is None else examples
        predictions = self.decode(records, examples, self.outputs(examples, batch_size))
        return predictions, self.score(records, predictions)
