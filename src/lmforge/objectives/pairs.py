"""BERT's next-sentence prediction (Devlin et al. 2019, sec. 3.1, task #2) and ALBERT's
sentence-order prediction (Lan et al. 2020, sec. 3.1), each added to masked LM.

The examples come from data.examples.nsp_pairs / sop_pairs ([CLS] A [SEP] B [SEP],
segment ids, `pair_label`); a pooled [CLS] classifier predicts the label.
"""
from __future__ import annotations

import torch.nn.functional as F

from lmforge.data.stream import ExampleFormat
from lmforge.heads import make_head
from lmforge.objectives.base import Loss, one_of
from lmforge.objectives.mlm import MaskedLM
from lmforge.objectives.registry import ObjectiveSpec, register

TASKS = ("nsp", "sop")


class PairMLM(MaskedLM):
    """Masked LM plus a two-way sentence-pair classifier (IsNext / NotNext or in order / swapped)."""

    bounds = {**MaskedLM.bounds, "task": one_of(TASKS)}

    def __init__(self, model, mask_id: int, task: str = "nsp", **mlm) -> None:
        super().__init__(model, mask_id, **mlm)
        self.check_values(dict(task=task))
        self.task = self.name = task
        self.pair = (model.heads[task] if task in model.heads
                     else make_head(model, "classification", n_labels=2))

    def forward(self, batch: dict) -> Loss:
        """MLM loss at the selected positions plus the pair loss on the pooled [CLS] state."""
        hidden = self.model(batch["input_ids"], batch["attention_mask"],
                            segment_ids=batch.get("segment_ids"), run_heads=False).last_hidden_state
        mlm = self.mlm_loss(hidden, batch["labels"])
        logits = self.pair(hidden, batch["attention_mask"])  # (B, 2)
        pair = F.cross_entropy(logits.float(), batch["pair_label"].view(-1))
        accuracy = (logits.argmax(-1) == batch["pair_label"].view(-1)).float().mean()
        return Loss(mlm.loss + pair, {**mlm.metrics, f"{self.task}_loss": pair.detach(),
                                      f"{self.task}_accuracy": accuracy.detach()})

    def heads(self) -> dict:
        """The MLM head and the pair classifier, saved with the model (BertForPreTraining's pair)."""
        return {"lm": self.lm, self.task: self.pair}


register(ObjectiveSpec(name="nsp", build=PairMLM.build, summary="masked LM + next-sentence prediction (BERT)",
                       aliases=("bert",), architectures=("encoder",), tokenizer="bert",
                       examples=ExampleFormat("pairs", pairs="nsp"), options={"task": "nsp"}))
register(ObjectiveSpec(name="sop", build=PairMLM.build,
                       summary="masked LM + sentence-order prediction (ALBERT)", aliases=("albert",),
                       architectures=("encoder",), tokenizer="bert",
                       examples=ExampleFormat("pairs", pairs="sop"), options={"task": "sop"}))
