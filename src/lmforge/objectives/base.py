"""What every pretraining objective provides to the training loop.

An objective is an nn.Module that owns the model it trains (and any extra modules such
as ELECTRA's generator) and the heads it needs. Its two halves are separate so the
data side is testable without a model:

- `corrupt(example, generator)`: one example (a dict of token lists) -> the model's
  inputs and labels for it, drawing only from `generator` (seeded per example, so a
  run is reproducible, resumable and independent of the number of processes);
- `forward(batch)`: a padded batch of tensors -> `Loss` (the scalar to minimise and
  the metrics to log).

`finish()` attaches the objective's heads to the model kept, so the saved model
carries them (an MLM-trained BERT saves as BertForMaskedLM). `build(model, tokenizer)`
makes one with the tokenizer's special ids: what the registry (registry.py) calls.
"""
from __future__ import annotations

import abc
import math
from lmforge.utils.errors import shown
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

IGNORE = -100  # label of positions that carry no loss (the reference library's convention)
SPECIAL_ROLES = ("cls", "sep", "pad", "bos", "eos")  # tokens an objective never masks nor predicts
# T's bounds: below 0.01 logits / T overflow fp32 (T=1e-45 gave a NaN loss, T=1e-30 a T^2 of 0); above
# 1000 every soft target is uniform. A loss weight's bound: every number a user chooses has one.
TEMPERATURE_RANGE = (0.01, 1000)
WEIGHT_MAX = 1000
# positions whose model reads some of its weights for some inputs only: XLNet's relative attention reads its
# query stream's start only under a target mapping, its segment term only with segment ids
SOME_INPUTS_ONLY = ("xl-relative",)


def reads_some_inputs_only(cfg) -> bool:
    """Whether a model of config `cfg` (None: no model) reads some of its weights for some inputs only: a
    position of SOME_INPUTS_ONLY, or Longformer's global projections where no token is global by default
    (n_global_tokens=0: its global_qkv idles on a batch that names none, as a pretraining batch does)."""
    if getattr(cfg, "position", None) in SOME_INPUTS_ONLY:
        return True
    return bool(getattr(cfg, "global_projections", False) and cfg.n_global_tokens == 0
                and "longformer" in cfg.layer_patterns())


def within(low=None, high=None, *, above: bool = False, below: bool = False, integer: bool = False) -> tuple:
    """A check_values rule (test, what the value must be): a finite number (an integer where `integer`)
    from `low` to `high` (None: no bound that side), strictly `above` low and `below` high where set."""
    def test(value) -> bool:
        kind = int if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
            return False
        return ((low is None or (value > low if above else value >= low))
                and (high is None or (value < high if below else value <= high)))
    said = [f"{'>' if above else '>='} {low:g}" if low is not None else "",
            f"{'<' if below else '<='} {high:g}" if high is not None else ""]
    return test, f"{'an integer' if integer else 'a number'} {' and '.join(s for s in said if s)}"


def one_of(choices: tuple) -> tuple:
    """A check_values rule: one of `choices`."""
    return (lambda value: isinstance(value, str) and value in choices), f"one of {', '.join(choices)}"


LOSS_WEIGHT, TEMPERATURE = within(0, WEIGHT_MAX), within(*TEMPERATURE_RANGE)


def check_bounds(options: dict, bounds: dict) -> None:
    """A ValueError naming the first of `options` (in `bounds`' order) that its rule in `bounds` (name ->
    (test, what the value must be)) refuses; a value the test cannot compare is refused alike."""
    for name, (test, said) in bounds.items():
        if name not in options:
            continue
        try:
            fine = bool(test(options[name]))
        except (TypeError, ValueError):  # text where a number goes, a list of text for fractions
            fine = False
        if not fine:
            raise ValueError(f"{name}={shown(options[name])}: must be {said}")


@dataclass
class Loss:
    """The scalar a step minimises, logged metrics, and the number of predictions the scalar is the mean
    of where each counts alike (a token-level loss: the training loop then weighs every prediction of a
    step's micro-batches alike, as the reference Trainer's num_items_in_batch does); None: the loss is one
    value for its batch (a sum of parts, a per-example loss), and each micro-batch counts alike."""

    loss: torch.Tensor
    metrics: dict = field(default_factory=dict)
    count: torch.Tensor | None = None


def predictions(target: torch.Tensor) -> torch.Tensor:
    """The number of rows of `target` token_loss averages over (those not IGNORE), as a device tensor."""
    return (target != IGNORE).sum()


def labelled(hidden: torch.Tensor, labels: torch.Tensor) -> tuple:
    """(rows (N, d), targets (N,)) of the positions of hidden (B, T, d) with a label. Eager selects
    them, so the LM head runs on those alone (~15 % of an MLM batch); a compiled step keeps every
    position, the unlabelled ones IGNOREd, as a selection's size would follow the data and break the
    graph (token_loss and top1_accuracy skip IGNORE rows: the same loss and accuracy)."""
    if torch.compiler.is_compiling():
        return hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    selected = labels != IGNORE
    return hidden[selected], labels[selected]


def token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (fp32) of (N, V) logits over the rows whose target (N,) is not IGNORE; 0
    (still attached to the graph) when there are none, never NaN."""
    if torch.compiler.is_compiling():
        total = F.cross_entropy(logits.float(), target, ignore_index=IGNORE, reduction="sum")
        return total / (target != IGNORE).sum().clamp(min=1)
    return F.cross_entropy(logits.float(), target) if target.numel() else logits.sum() * 0.0


def top1_accuracy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Share of rows of (N, V) logits whose target (N,) scores highest (0 for no rows), detached.
    Compared with the row maximum rather than argmax: amax is ~7x faster on CPU over a
    vocabulary, a fifth of a small model's MLM step otherwise (ties, vanishingly rare, count)."""
    logits = logits.detach()
    if torch.compiler.is_compiling():  # every position kept (see `labelled`): count the labelled ones
        real = target != IGNORE
        hit = logits.gather(-1, target.clamp(min=0)[:, None]).squeeze(-1) >= logits.amax(-1)
        return (hit & real).sum() / real.sum().clamp(min=1)
    if not target.numel():
        return torch.zeros((), device=logits.device)
    return (logits.gather(-1, target[:, None]).squeeze(-1) >= logits.amax(-1)).float().mean()


def pad(rows: list, value: int, dtype=torch.long) -> torch.Tensor:
    """Right-pad lists of ints to one (B, T) tensor."""
    T = max(len(r) for r in rows)
    out = torch.full((len(rows), T), value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=dtype)
    return out


def tokenizer_pad(tokenizer) -> int:
    """The tokenizer's pad id (0 without one: padding is masked out anyway)."""
    return tokenizer.special_id("pad") or 0


def tokenizer_specials(tokenizer, roles: tuple = SPECIAL_ROLES) -> tuple:
    """The ids of the tokenizer's special tokens in `roles`, those it has."""
    return tuple(i for i in (tokenizer.special_id(r) for r in roles) if i is not None)


def tokenizer_mask(tokenizer, user: str) -> int:
    """The tokenizer's mask id; ValueError naming its `user` (an objective class) when it has none."""
    mask = tokenizer.special_id("mask")
    if mask is None:
        raise ValueError(f"{user} needs a tokenizer with a mask token")
    return mask


class Objective(nn.Module, abc.ABC):
    """Base class: keeps the model, pads batches, attaches heads at the end; subclasses define
    `forward`."""

    name = "objective"
    bounds: dict = {}  # keyword argument -> its rule (within, one_of): what check_values enforces
    # whether the loss of every step, whatever its batch, reaches every parameter of the model's forward and
    # of the objective's own heads and modules (no step that skips a head, as SpanBERT's on a batch with no
    # span). A wrong True stops a DDP run on its second step, a missing one costs DDP a graph traversal a
    # step: an objective sets it only where it holds for every batch
    all_used = False

    def __init__(self, model: nn.Module, pad_id: int = 0) -> None:
        super().__init__()
        self.model = model
        self.pad_id = pad_id

    @classmethod
    def build(cls, model: nn.Module, tokenizer, **options) -> Objective:
        """This objective around `model`, padding with the tokenizer's pad id; `options` go to __init__."""
        return cls(model, pad_id=tokenizer_pad(tokenizer), **options)

    @classmethod
    def check_values(cls, options: dict) -> None:
        """A ValueError for one of `options` (keyword arguments of build) outside its rule in cls.bounds:
        said before any model is built (objectives.keywords), and by the constructor, which calls it with
        its arguments, so each bound is written once."""
        check_bounds(options, cls.bounds)

    def uses_every_parameter(self) -> bool:
        """Whether every training step gives every trainable parameter a gradient, so that DDP need not
        search for unused ones (train.distributed.wrap): the objective says so of its loss (all_used), no
        model in it holds a trainable head that no objective in it trains (a converted checkpoint's pooler
        or NSP head, a student's copy of its teacher's), and none reads weights for some inputs only."""
        if not self.all_used:
            return False
        trained = {id(head) for part in self.modules() if isinstance(part, Objective)
                   for head in part.heads().values()}
        for model in self.modules():
            heads = getattr(model, "heads", None)
            if not isinstance(heads, nn.ModuleDict) or not any(p.requires_grad for p in model.parameters()):
                continue  # not a model, or a frozen one (a teacher): DDP reduces no gradient of it
            if reads_some_inputs_only(getattr(model, "config", None)):
                return False
            if any(id(head) not in trained and any(p.requires_grad for p in head.parameters())
                   for head in heads.values()):
                return False
        return True

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        """One example -> inputs and labels (lists); the default passes it through."""
        return dict(example)

    def collate(self, examples: list) -> dict:
        """Corrupted examples -> a padded batch: ids with the pad id, labels with IGNORE,
        other lists with 0, per-example ints stacked, and the attention mask."""
        batch = {}
        for key in examples[0]:
            if isinstance(examples[0][key], int):  # one label per example (a sentence pair's)
                batch[key] = torch.tensor([e[key] for e in examples])
                continue
            value = self.pad_id if key == "input_ids" else IGNORE if key.endswith("labels") else 0
            batch[key] = pad([e[key] for e in examples], value)
        lengths = torch.tensor([len(e["input_ids"]) for e in examples])
        batch["attention_mask"] = (torch.arange(batch["input_ids"].shape[1])[None] < lengths[:, None]).long()
        return batch

    @abc.abstractmethod
    def forward(self, batch: dict) -> Loss:
        """A padded batch -> Loss."""

    def heads(self) -> dict:
        """The heads this objective trains, by name (attached to the kept model by `finish`)."""
        return {}

    def carried(self):
        """What training carries from one batch to the next beside the weights (tensors, or None: nothing);
        a checkpoint keeps it, so that a resumed run goes on exactly (ELMo's stateful LSTM states). A
        checkpoint holds rank 0's: a run of several processes that carries state resumes exactly on rank 0
        only."""
        return None

    def carry(self, state) -> None:
        """Take up what `carried` gave at a checkpoint (a resume)."""

    def finish(self) -> nn.Module:
        """The model to keep, with this objective's heads attached."""
        for name, head in self.heads().items():
            if name not in self.model.heads:
                self.model.add_head(name, head)
        return self.model
