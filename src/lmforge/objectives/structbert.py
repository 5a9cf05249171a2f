"""StructBERT's structural objectives (Wang et al. 2020, sec. 2.2), each added to masked LM.

Word structural objective: after BERT's masking, a proportion of the unmasked trigrams
(5 %) is shuffled and the model predicts the original token at every position of a
shuffled trigram with the MLM's softmax classifier, i.e. it maximises
sum log P(pos_1 = t_1, ..., pos_K = t_K | shuffled), K = 3. The rate counts trigrams
among the disjoint trigrams the unmasked tokens make, so 5 % of the unmasked tokens move.
A shuffle is one of the five non-identity permutations, so a shuffled trigram of three
distinct tokens always changes.

Sentence structural objective: for segments S1, S2 (data.examples.sso_pairs) the [CLS]
state predicts whether S2 follows S1 (0), precedes it (1) or comes from another
document (2). The losses are summed with equal weights.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lmforge.data.stream import ExampleFormat
from lmforge.heads import make_head
from lmforge.objectives.base import IGNORE, Loss, within
from lmforge.objectives.mlm import MaskedLM, budget
from lmforge.objectives.registry import ObjectiveSpec, register

K = 3  # trigrams: the paper's balance of reconstructability and robustness
PERMUTATIONS = ((0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))  # every order but the original


def choose_trigrams(free: list, k: int, generator: torch.Generator) -> list:
    """Up to k non-overlapping windows of K free positions, in random order; their first positions."""
    starts = [i for i in range(len(free) - K + 1) if all(free[i:i + K])]
    chosen: list = []
    used: set = set()
    for j in torch.randperm(len(starts), generator=generator).tolist():
        if len(chosen) == k:
            break
        window = range(starts[j], starts[j] + K)
        if not used.intersection(window):
            chosen.append(starts[j])
            used.update(window)
    return sorted(chosen)


def shuffle_trigrams(ids: list, starts: list, generator: torch.Generator) -> tuple:
    """Permute each trigram at `starts`: (shuffled ids, wso_labels = originals at moved positions)."""
    ids, labels = list(ids), [IGNORE] * len(ids)
    picks = torch.randint(len(PERMUTATIONS), (len(starts),), generator=generator).tolist()
    for s, pick in zip(starts, picks):
        original = ids[s:s + K]
        ids[s:s + K] = [original[j] for j in PERMUTATIONS[pick]]
        labels[s:s + K] = original
    return ids, labels


class StructuralMLM(MaskedLM):
    """StructBERT: masked LM + word structural objective (+ sentence structural objective)."""

    name = "structural"

    bounds = {**MaskedLM.bounds, "wso_rate": within(0, 1, below=True)}

    def __init__(self, model, mask_id: int, wso_rate: float = 0.05, sso: bool = True, **mlm) -> None:
        super().__init__(model, mask_id, **mlm)
        self.check_values(dict(wso_rate=wso_rate))
        self.wso_rate = wso_rate
        self.sso = None
        if sso:  # next / previous / random: a 3-way classifier on the pooled [CLS] state
            self.sso = (model.heads["sso"] if "sso" in model.heads
                        else make_head(model, "classification", n_labels=3))

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        """BERT's masking, then trigrams of unmasked tokens shuffled (wso_labels: their originals)."""
        out = super().corrupt(example, generator)
        free = [t not in self.special and label == IGNORE
                for t, label in zip(example["input_ids"], out["labels"])]
        k = budget(sum(free), self.wso_rate / K, generator)  # rate x (unmasked tokens / 3) trigrams
        ids, wso = shuffle_trigrams(out["input_ids"], choose_trigrams(free, k, generator), generator)
        return {**out, "input_ids": ids, "wso_labels": wso}

    def wso_loss(self, hidden: torch.Tensor, wso_labels: torch.Tensor) -> tuple:
        """Cross-entropy of the original tokens at the shuffled positions (0 when none), and accuracy."""
        moved = wso_labels != IGNORE  # (B, T)
        logits = self.lm(hidden[moved])  # (N, V): the MLM's classifier on the ~5 % shuffled positions
        target = wso_labels[moved]
        if not target.numel():  # a batch of short sequences may hold no trigram to shuffle
            return logits.sum() * 0.0, torch.zeros((), device=hidden.device)
        return F.cross_entropy(logits.float(), target), (logits.argmax(-1) == target).float().mean()

    def forward(self, batch: dict) -> Loss:
        """MLM + WSO (+ SSO on the pooled [CLS] state), equal weights."""
        hidden = self.model(batch["input_ids"], batch["attention_mask"],
                            segment_ids=batch.get("segment_ids"), run_heads=False).last_hidden_state
        mlm = self.mlm_loss(hidden, batch["labels"])
        wso, wso_accuracy = self.wso_loss(hidden, batch["wso_labels"])
        metrics = {**mlm.metrics, "mlm_loss": mlm.loss.detach(), "wso_loss": wso.detach(),
                   "wso_accuracy": wso_accuracy.detach()}
        loss = mlm.loss + wso
        if self.sso is not None:
            if "pair_label" not in batch:
                raise ValueError("the sentence structural objective needs segment pairs with a pair_label "
                                 "(data.examples.sso_pairs); use sso=False for single sequences")
            logits = self.sso(hidden, batch["attention_mask"])  # (B, 3)
            label = batch["pair_label"].view(-1)
            sso = F.cross_entropy(logits.float(), label)
            accuracy = (logits.argmax(-1) == label).float().mean()
            metrics.update(sso_loss=sso.detach(), sso_accuracy=accuracy.detach())
            loss = loss + sso
        return Loss(loss, metrics)

    def heads(self) -> dict:
        """The MLM head and (with SSO) the 3-way sentence classifier, saved with the model."""
        return {"lm": self.lm, **({"sso": self.sso} if self.sso is not None else {})}


register(ObjectiveSpec(name="structural", build=StructuralMLM.build,
                       summary="masked LM + word and sentence structural objectives (StructBERT)",
                       aliases=("structbert",), architectures=("encoder",), tokenizer="bert",
                       examples=ExampleFormat("pairs", pairs="structural")))
