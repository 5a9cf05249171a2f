"""Masked language modelling (Devlin et al. 2019, sec. 3.1 and appendix A.1).

A budget of 15 % of the maskable tokens is selected; of those 80 % become [MASK], 10 %
a random token and 10 % stay unchanged, and the model predicts the original token at
every selected position. Whole-word masking (BERT's later release) selects whole words
(a word = a first piece and its continuations) but still decides 80/10/10 per token, as
the reference implementation does. The vocabulary projection runs on the selected
positions only — about 15 % of the cost of projecting every position.
"""
from __future__ import annotations

import math

import torch

from lmforge.data.stream import ExampleFormat
from lmforge.heads import make_head
from lmforge.objectives.base import (IGNORE, Loss, Objective, labelled, predictions, token_loss,
                                     tokenizer_mask, tokenizer_pad, tokenizer_specials, top1_accuracy,
                                     within)
from lmforge.objectives.registry import ObjectiveSpec, register


def fractions(value) -> bool:
    """Whether `value` is three shares ([MASK], random, unchanged), each from 0 to 1, summing to 1."""
    return (len(value) == 3 and all(within(0, 1)[0](v) for v in value) and abs(sum(value) - 1) <= 1e-6)


REPLACE = (fractions, "three fractions [MASK], random, unchanged, each >= 0, summing to 1")


def budget(n: int, rate: float, generator: torch.Generator) -> int:
    """rate x n rounded up or down at random, so the expected selection is exactly rate x n."""
    x = rate * n
    return int(math.floor(x)) + int(torch.rand((), generator=generator) < x - math.floor(x))


def words(example: dict, candidates: list) -> list:
    """Candidate positions grouped into words by `word_starts` (each position its own word without it)."""
    starts = example.get("word_starts")
    if starts is None:
        return [[i] for i in candidates]
    groups: list = []
    for i in candidates:
        if starts[i] or not groups or groups[-1][-1] != i - 1:
            groups.append([i])
        else:
            groups[-1].append(i)
    return groups


def real_tokens(vocab_size: int, never: set) -> torch.Tensor:
    """The ids 0..vocab_size-1 less `never` (the special tokens and [MASK]): what a random replacement
    draws from, so it puts a word where a word was, never a [SEP], [PAD] or [MASK] mid-text."""
    keep = torch.ones(vocab_size, dtype=torch.bool, device="cpu")  # drawn on the data side, even where
    # the model is built on the meta device (the bake-off's dry plan)
    keep[[i for i in never if 0 <= i < vocab_size]] = False
    if not keep.any():  # else every draw fails mid-run (randint of an empty range)
        raise ValueError(f"vocab_size={vocab_size}: every id is a special token or [MASK]; a random "
                         "replacement needs a word to draw")
    return keep.nonzero().squeeze(-1)


def select_words(groups: list, n: int, generator: torch.Generator) -> list:
    """Whole words in random order while they fit in the budget of n positions (BERT's rule)."""
    chosen: list = []
    for g in torch.randperm(len(groups), generator=generator).tolist():
        if len(chosen) >= n:
            break
        if len(chosen) + len(groups[g]) <= n:
            chosen.extend(groups[g])
    return sorted(chosen)


class MaskedLM(Objective):
    """BERT's masked LM: corruption on the data side, the LM head on the selected positions."""

    name = "mlm"
    bounds = {"rate": within(0, 1, above=True, below=True), "replace": REPLACE}
    all_used = True  # a batch with nothing selected still runs the head, on no rows (a zero gradient)

    def __init__(self, model, mask_id: int, rate: float = 0.15, replace: tuple = (0.8, 0.1, 0.1),
                 whole_word: bool = False, special_ids: tuple = (), pad_id: int = 0) -> None:
        super().__init__(model, pad_id)
        self.check_values(dict(rate=rate, replace=replace))
        self.mask_id, self.rate, self.replace, self.whole_word = mask_id, rate, tuple(replace), whole_word
        self.special = set(special_ids) | {pad_id}
        self.vocab_size = model.config.vocab_size
        self.replacements = real_tokens(self.vocab_size, self.special | {mask_id})
        self.lm = model.heads["lm"] if "lm" in model.heads else make_head(model, "lm")

    @classmethod
    def build(cls, model, tokenizer, **options) -> MaskedLM:
        """This objective around `model`, with the tokenizer's mask, pad and special ids; `options` go to
        __init__ (the subclasses' too: SpanMLM, StructuralMLM, PairMLM)."""
        return cls(model, tokenizer_mask(tokenizer, cls.__name__), special_ids=tokenizer_specials(tokenizer),
                   pad_id=tokenizer_pad(tokenizer), **options)

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        """Select, replace and label: input_ids corrupted, labels = originals at selected positions."""
        ids = list(example["input_ids"])
        candidates = [i for i, t in enumerate(ids) if t not in self.special]
        groups = words(example, candidates) if self.whole_word else [[i] for i in candidates]
        chosen = select_words(groups, budget(len(candidates), self.rate, generator), generator)
        labels = [IGNORE] * len(ids)
        draws = torch.rand(len(chosen), generator=generator).tolist()
        randoms = self.random_tokens(len(chosen), generator)
        for pos, u, rnd in zip(chosen, draws, randoms):
            labels[pos] = ids[pos]
            if u < self.replace[0]:
                ids[pos] = self.mask_id
            elif u < self.replace[0] + self.replace[1]:
                ids[pos] = rnd
        out = {k: v for k, v in example.items() if k != "word_starts"}
        return {**out, "input_ids": ids, "labels": labels}

    def random_tokens(self, n: int, generator: torch.Generator) -> list:
        """n ids drawn uniformly from the vocabulary less the special tokens and [MASK]."""
        return self.replacements[torch.randint(len(self.replacements), (n,), generator=generator)].tolist()

    def mlm_loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> Loss:
        """Cross-entropy of the original tokens at the selected positions of hidden (B, T, d)."""
        rows, target = labelled(hidden, labels)
        logits = self.lm(rows)  # (N, V): only the ~15 % selected positions
        # a batch without a selected position (very short texts) contributes nothing, not NaN
        loss = token_loss(logits, target)
        accuracy = top1_accuracy(logits, target)
        return Loss(loss, {"mlm_accuracy": accuracy.detach()}, predictions(target))

    def forward(self, batch: dict) -> Loss:
        """Masked LM loss of a padded batch."""
        hidden = self.model(batch["input_ids"], batch["attention_mask"],
                            segment_ids=batch.get("segment_ids"), run_heads=False).last_hidden_state
        return self.mlm_loss(hidden, batch["labels"])

    def heads(self) -> dict:
        """The MLM head, saved with the model."""
        return {"lm": self.lm}


# RoBERTa's recipe: FULL-SENTENCES packing, masks drawn anew each epoch (Liu et al. 2019, sec. 4)
register(ObjectiveSpec(name="mlm", build=MaskedLM.build, summary="masked LM (BERT, RoBERTa)",
                       aliases=("masked-lm", "roberta"), architectures=("encoder",), tokenizer="bert",
                       examples=ExampleFormat("sentences")))
register(ObjectiveSpec(name="wwm", build=MaskedLM.build, summary="whole-word masked LM",
                       aliases=("whole-word",), architectures=("encoder",), tokenizer="bert",
                       examples=ExampleFormat("sentences", word_starts=True), options={"whole_word": True}))
