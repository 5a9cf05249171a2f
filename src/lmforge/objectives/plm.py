"""Permutation language modelling (Yang et al. 2019, XLNet, sec. 2.2-2.5).

Per example a factorisation order z is drawn uniformly (eq. 3); the model predicts the
last 1/K of it (sec. 2.3 "partial prediction": |z| - c ≈ |z|/K, K = 6 or 7) from the
positions earlier in the order, with two-stream attention (layers/variants/two_stream.py): the
content stream of position i sees every position not later than i in z, the query stream
of a target only the positions strictly earlier. Tokens are never replaced — the query
stream, which knows its position but not its token, is what makes the prediction.

Choices a reader of the paper may question:
- Token-level targets, as in the paper's equations. The released code predicts
  contiguous n-gram spans and lets non-target tokens see each other bidirectionally;
  here every position, target or not, follows the one order z strictly.
- Special tokens ([CLS], [SEP]) and padding are never targets; special tokens are part
  of the order (visible context), padding is never attended.
- Segment recurrence (sec. 2.5) with `mem_len` > 0: the example's first
  min(mem_len, L // 2) tokens are the previous segment. The content stream runs over it
  without gradient, and its per-layer states become the memory that every position of
  the rest (the segment whose order is permuted) attends to. Memory rows are left-padded
  so each memory ends right before its segment (the relative distances stay exact).

The data side (`corrupt`, drawing only from its generator) gives each position's rank in
z and the targets; `collate` turns them into the reference's inputs: perm_mask (B, T, T),
1 where i may NOT attend to j, target_mapping (B, n, T), labels (B, n).
"""
from __future__ import annotations

import torch

from lmforge.data.stream import ExampleFormat
from lmforge.heads import make_head
from lmforge.objectives.base import (IGNORE, Loss, Objective, labelled, pad, predictions, token_loss,
                                     tokenizer_pad, tokenizer_specials, top1_accuracy, within)
from lmforge.objectives.mlm import budget
from lmforge.objectives.registry import ObjectiveSpec, register


def factorisation_order(n: int, candidates: list, n_targets: int, generator: torch.Generator) -> tuple:
    """A random order z of n positions whose last n_targets are drawn from candidates.

    Returns (rank: position -> index in z, targets: positions in the order they are predicted)."""
    z = torch.randperm(n, generator=generator).tolist()
    allowed = set(candidates)
    targets = [i for i in z if i in allowed][len(candidates) - n_targets:]
    chosen = set(targets)
    z = [i for i in z if i not in chosen] + targets  # z>c: the targets come last
    rank = [0] * n
    for t, i in enumerate(z):
        rank[i] = t
    return rank, targets


def permutation_masks(ranks: list, targets: list, T: int) -> tuple:
    """Per-example ranks and targets -> perm_mask (B, T, T) (1: i may not see j, i.e. j is not
    earlier in z; padding rows and columns all 1) and one-hot target_mapping (B, n, T)."""
    B, n = len(ranks), max((len(t) for t in targets), default=0)
    perm_mask = torch.ones(B, T, T)
    target_mapping = torch.zeros(B, max(n, 1), T)
    for b, (rank, chosen) in enumerate(zip(ranks, targets)):
        r = torch.tensor(rank)
        L = len(rank)
        perm_mask[b, :L, :L] = (r[None, :] >= r[:, None]).float()  # j at or after i in z
        target_mapping[b, torch.arange(len(chosen)), torch.tensor(chosen, dtype=torch.long)] = 1.0
    return perm_mask, target_mapping


class PermutationLM(Objective):
    """XLNet's permutation LM: a random order per example, the last 1/K of it predicted."""

    name = "plm"
    all_used = False  # XLNet's segment term idles without segment ids (SOME_INPUTS_ONLY says so too)

    # K: the last 1/K of the order is predicted; mem_len: the memory segment's tokens (0: none)
    bounds = {"K": within(1, above=True), "mem_len": within(0, integer=True)}

    def __init__(self, model, K: float = 6.0, special_ids: tuple = (), pad_id: int = 0,
                 mem_len: int = 0) -> None:
        super().__init__(model, pad_id)
        if model.config.position != "xl-relative":
            raise ValueError("permutation LM needs two-stream attention: position='xl-relative' "
                             "(an XLNet preset)")
        self.check_values({"K": K, "mem_len": mem_len})
        self.K, self.mem_len = K, mem_len
        self.special = set(special_ids) | {pad_id}
        self.lm = model.heads["lm"] if "lm" in model.heads else make_head(model, "lm")

    @classmethod
    def build(cls, model, tokenizer, **options) -> PermutationLM:
        """XLNet around `model`: each example's first half is the memory segment of its second (sec. 2.5)."""
        options = {"mem_len": model.config.max_seq_len // 2, **options}
        return cls(model, special_ids=tokenizer_specials(tokenizer), pad_id=tokenizer_pad(tokenizer),
                   **options)

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        """One example -> its tokens, each position's rank in z, the targets and their labels
        (and the memory segment's tokens when mem_len > 0)."""
        ids = list(example["input_ids"])
        split = min(self.mem_len, len(ids) // 2)
        memory, ids = ids[:split], ids[split:]
        candidates = [i for i, t in enumerate(ids) if t not in self.special]
        n = min(len(candidates), max(1, budget(len(candidates), 1 / self.K, generator)))
        rank, targets = factorisation_order(len(ids), candidates, n, generator)
        out = {"input_ids": ids, "rank": rank, "targets": targets, "labels": [ids[i] for i in targets]}
        if "segment_ids" in example:
            out["segment_ids"] = list(example["segment_ids"][split:])
        if self.mem_len:
            out["memory_ids"] = memory
        return out

    def collate(self, examples: list) -> dict:
        """Pad, and build perm_mask, target_mapping and (B, n) labels; left-pad the memory."""
        batch = super().collate([{k: e[k] for k in ("input_ids", "segment_ids") if k in e} for e in examples])
        batch["perm_mask"], batch["target_mapping"] = permutation_masks(
            [e["rank"] for e in examples], [e["targets"] for e in examples], batch["input_ids"].shape[1])
        batch["labels"] = pad([e["labels"] or [IGNORE] for e in examples], IGNORE)
        if self.mem_len:
            M = max(1, max(len(e["memory_ids"]) for e in examples))
            rows = [[self.pad_id] * (M - len(e["memory_ids"])) + e["memory_ids"] for e in examples]
            batch["memory_ids"] = torch.tensor(rows)
            batch["memory_mask"] = torch.tensor([[0] * (M - len(e["memory_ids"])) + [1] * len(e["memory_ids"])
                                                 for e in examples])
        return batch

    def memory(self, batch: dict):
        """The previous segment's per-layer content states (stop-gradient, sec. 2.5) and their mask."""
        if "memory_ids" not in batch:
            return None, batch["attention_mask"]
        with torch.no_grad():
            M = batch["memory_ids"].shape[1]
            mems = self.model(batch["memory_ids"], batch["memory_mask"], mem_len=M, run_heads=False).mems
        return mems, torch.cat([batch["memory_mask"], batch["attention_mask"]], dim=1)

    def forward(self, batch: dict) -> Loss:
        """Cross-entropy of the targets from the query stream (eq. 5)."""
        mems, mask = self.memory(batch)
        g = self.model(batch["input_ids"], mask, segment_ids=batch.get("segment_ids"),
                       perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"], mems=mems,
                       run_heads=False).last_hidden_state  # (B, n, d): the query stream
        labels = batch["labels"]
        rows, target = labelled(g, labels)
        logits = self.lm(rows)  # (N, V): the vocabulary projection on targets only
        loss = token_loss(logits, target)
        accuracy = top1_accuracy(logits, target)
        return Loss(loss, {"plm_accuracy": accuracy.detach()}, predictions(target))

    def heads(self) -> dict:
        """The LM head (saved with the model: an XLNet LM exports as XLNetLMHeadModel)."""
        return {"lm": self.lm}


register(ObjectiveSpec(name="plm", build=PermutationLM.build, summary="permutation LM (XLNet)",
                       aliases=("xlnet",), architectures=("encoder",), tokenizer="bert",
                       examples=ExampleFormat("sentences"),
                       requires={"position": "xl-relative"}))  # two-stream attention is XLNet's
