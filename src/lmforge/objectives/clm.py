"""Causal language modelling (Radford et al. 2018, eq. 1): predict every next token."""
from __future__ import annotations

from lmforge.data.stream import ExampleFormat
from lmforge.heads import make_head
from lmforge.objectives.base import IGNORE, Loss, Objective, labelled, predictions, token_loss
from lmforge.objectives.registry import ObjectiveSpec, register


class CausalLM(Objective):
    """Next-token cross-entropy over every real position of a decoder's input."""

    name = "clm"
    all_used = True  # one-token texts only: the head runs on no rows (a zero gradient)

    def __init__(self, model, pad_id: int = 0) -> None:
        super().__init__(model, pad_id)
        self.lm = model.heads["lm"] if "lm" in model.heads else make_head(model, "lm")

    def forward(self, batch: dict) -> Loss:
        """Loss of token t+1 given tokens <= t, at positions whose successor is real."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        hidden = self.model(ids, mask, run_heads=False).last_hidden_state
        target = ids[:, 1:].masked_fill(~mask[:, 1:].bool(), IGNORE)  # (B, T-1): where the next token exists
        rows, target = labelled(hidden[:, :-1], target)
        loss = token_loss(self.lm(rows), target)  # (N, V) logits
        return Loss(loss, {"perplexity": loss.detach().exp()}, predictions(target))

    def heads(self) -> dict:
        """The LM head, saved with the model."""
        return {"lm": self.lm}


# blocks joined by </s> (or [SEP]) across documents, as GPT-2's WebText training does
register(ObjectiveSpec(name="clm", build=CausalLM.build, summary="causal LM (GPT)",
                       aliases=("causal-lm", "gpt"), architectures=("decoder",), tokenizer="gpt2",
                       examples=ExampleFormat("blocks", roles=("eos", "sep"))))
