"""Teacher forcing for encoder-decoders (Vaswani et al. 2017, sec. 3; Raffel et al. 2020, sec. 3.1.2).

What T5's span corruption, BART's denoising and the encoder-decoder prefix LM share:
`corrupt` gives the encoder's `input_ids` and the target as `labels`; the decoder reads
the target shifted one position right after `decoder_start_token_id` (T5: the pad id,
BART: </s>) and is trained to predict every target token. The vocabulary projection
runs on the target's real positions only.
"""
from __future__ import annotations

import torch

from lmforge.heads import make_head
from lmforge.objectives.base import (IGNORE, Loss, Objective, labelled, predictions, token_loss,
                                     top1_accuracy, within)


def shift_right(labels: torch.Tensor, start: int, pad: int) -> torch.Tensor:
    """(B, T) labels -> (B, T) decoder inputs: `start`, then the labels without their last one
    (IGNORE padding read as the pad id)."""
    shifted = torch.cat([torch.full_like(labels[:, :1], start), labels[:, :-1]], dim=1)
    return shifted.masked_fill(shifted == IGNORE, pad)


def add_decoder_inputs(batch: dict, examples: list, start: int, pad: int) -> dict:
    """Add to a padded batch the decoder's inputs (its IGNORE-padded labels shifted right after
    `start`) and the decoder's attention mask (each example's own target length)."""
    labels = batch["labels"]
    lengths = torch.tensor([len(e["labels"]) for e in examples])
    batch["decoder_input_ids"] = shift_right(labels, start, pad)
    batch["decoder_attention_mask"] = (torch.arange(labels.shape[1])[None] < lengths[:, None]).long()
    return batch


def teacher_forced_loss(model, lm, batch: dict) -> Loss:
    """Cross-entropy of every target token of a batch with decoder inputs (mean over the tokens)."""
    hidden = model(batch["input_ids"], batch["attention_mask"], decoder_input_ids=batch["decoder_input_ids"],
                   decoder_attention_mask=batch["decoder_attention_mask"],
                   run_heads=False).last_hidden_state  # (B, T_target, d)
    rows, target = labelled(hidden, batch["labels"])
    logits = lm(rows)  # (N, V): the projection runs on the real target positions only
    loss = token_loss(logits, target)
    accuracy = top1_accuracy(logits, target)
    return Loss(loss, {"perplexity": loss.detach().exp(), "accuracy": accuracy.detach()}, predictions(target))


def _with_labels(example: dict) -> dict:
    """The example with its target under "labels" (padded with IGNORE, never trained on as a 0)."""
    if "target_ids" not in example:
        return example
    example = dict(example)
    example.setdefault("labels", example.pop("target_ids"))
    return example


class Seq2SeqLM(Objective):
    """Cross-entropy of every target token given the source and the target's earlier tokens."""

    name = "seq2seq"
    all_used = True  # every target has a token (its </s> at least): the head runs on every batch
    bounds = {"decoder_start_id": ((lambda v: v is None or within(0, integer=True)[0](v)), "an integer >= 0")}

    def __init__(self, model, pad_id: int = 0, decoder_start_id: int | None = None) -> None:
        super().__init__(model, pad_id)
        self.check_values({"decoder_start_id": decoder_start_id})
        cfg = model.config
        if cfg.architecture != "encoder-decoder":
            raise ValueError(f"objective {self.name!r} trains an encoder-decoder, not a {cfg.architecture}")
        start = cfg.decoder_start_token_id if decoder_start_id is None else decoder_start_id
        if start is None:
            raise ValueError(f"objective {self.name!r} needs decoder_start_token_id (in the config or "
                             "as decoder_start_id)")
        self.decoder_start_id = start
        self.lm = model.heads["lm"] if "lm" in model.heads else make_head(model, "lm")

    def collate(self, examples: list) -> dict:
        """Pad sources and targets; add the shifted decoder inputs and the decoder's mask. A target
        under "target_ids" (data.examples.source_target's key) is read as the labels."""
        examples = [_with_labels(e) for e in examples]
        batch = super().collate(examples)  # input_ids, labels (IGNORE-padded), attention_mask
        return add_decoder_inputs(batch, examples, self.decoder_start_id, self.pad_id)

    def forward(self, batch: dict) -> Loss:
        """Teacher-forced loss of a padded batch (mean over the target tokens)."""
        return teacher_forced_loss(self.model, self.lm, batch)

    def heads(self) -> dict:
        """The LM head, saved with the model."""
        return {"lm": self.lm}
