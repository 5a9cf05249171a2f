"""Prefix language modelling (Raffel et al. 2020, sec. 3.2.1 and fig. 3; Dong et al. 2019, UniLM).

A text is split at a uniformly random point into a prefix and a continuation (T5 sec.
3.3.1); the model reads the prefix bidirectionally and predicts the continuation left to
right, with the loss on the continuation only.

- Decoders (`PrefixLM`): one stack under the prefix-LM mask (model.Decoder's
  `prefix_lengths`): a prefix position sees the whole prefix, a continuation position sees
  everything up to itself. The last prefix position predicts the first continuation token.
  Full attention only: the spec refuses a windowed decoder (full_attention) before any work.
- Encoder-decoders (`EncoderDecoderPrefixLM`): the split *is* the architecture — the
  encoder reads the prefix (bidirectional by construction), the decoder generates the
  continuation (T5's "prefix LM" objective, sec. 3.3.1): plain teacher forcing.

`prefix_lm(model, ...)` picks the one that fits the model.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lmforge.data.stream import ExampleFormat
from lmforge.heads import make_head
from lmforge.objectives.base import IGNORE, Loss, Objective, tokenizer_pad
from lmforge.objectives.registry import ObjectiveSpec, register
from lmforge.objectives.seq2seq import Seq2SeqLM


def split_point(length: int, generator: torch.Generator) -> int:
    """P uniform in [1, length - 1]: both parts non-empty (1 for a one-token text)."""
    return 1 + int(torch.randint(max(length - 1, 1), (), generator=generator))


class PrefixLM(Objective):
    """A decoder under the prefix-LM mask; next-token loss on the continuation only."""

    name = "prefix-lm"
    all_used = False  # a batch of one-token texts skips the LM head (an untied one has weights of its own)

    def __init__(self, model, pad_id: int = 0) -> None:
        super().__init__(model, pad_id)
        if model.config.architecture != "decoder":
            raise ValueError(f"PrefixLM trains a decoder, not a {model.config.architecture} "
                             "(an encoder-decoder's prefix LM is EncoderDecoderPrefixLM)")
        self.lm = model.heads["lm"] if "lm" in model.heads else make_head(model, "lm")

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        """Draw the prefix length P; labels[t] = token t+1 where t+1 >= P (the continuation)."""
        ids = list(example["input_ids"])
        P = split_point(len(ids), generator)
        labels = [ids[t + 1] if t + 1 >= P else IGNORE for t in range(len(ids) - 1)] + [IGNORE]
        return {"input_ids": ids, "labels": labels, "prefix_length": P}

    def forward(self, batch: dict) -> Loss:
        """Loss of the continuation's tokens, each given the prefix and the continuation before it."""
        hidden = self.model(batch["input_ids"], batch["attention_mask"], run_heads=False,
                            prefix_lengths=batch["prefix_length"]).last_hidden_state
        selected = batch["labels"] != IGNORE  # (B, T)
        if not selected.any():  # one-token texts have no continuation
            zero = hidden.sum() * 0.0
            return Loss(zero, {"perplexity": zero.detach() + 1.0}, selected.sum())
        logits = self.lm(hidden[selected])  # (N, V)
        loss = F.cross_entropy(logits.float(), batch["labels"][selected])
        return Loss(loss, {"perplexity": loss.detach().exp()}, selected.sum())

    def heads(self) -> dict:
        """The LM head, saved with the model."""
        return {"lm": self.lm}


class EncoderDecoderPrefixLM(Seq2SeqLM):
    """The encoder-decoder prefix LM: source = the prefix, target = the continuation (+ eos)."""

    name = "prefix-lm"

    def __init__(self, model, pad_id: int = 0, eos_id: int | None = None,
                 decoder_start_id: int | None = None) -> None:
        super().__init__(model, pad_id, decoder_start_id)
        self.eos_id = eos_id

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        """Split at P: input_ids = tokens before P, labels = tokens from P on (each + eos, as T5)."""
        ids = list(example["input_ids"])
        P = split_point(len(ids), generator)
        eos = [self.eos_id] if self.eos_id is not None else []
        return {"input_ids": ids[:P] + eos, "labels": ids[P:] + eos}


def prefix_lm(model, pad_id: int = 0, eos_id: int | None = None, decoder_start_id: int | None = None):
    """The prefix LM that fits `model`: masked for a decoder, split for an encoder-decoder."""
    if model.config.architecture == "encoder-decoder":
        return EncoderDecoderPrefixLM(model, pad_id, eos_id, decoder_start_id)
    return PrefixLM(model, pad_id)


def full_attention(cfg) -> tuple | None:
    """None where a model of `cfg` takes the prefix-LM mask, else (the field as set, why not): a decoder's
    every layer must attend fully (the stack's prefix mask, layers.stack); a window's prefix would need a
    bidirectional band of its own. An encoder-decoder splits the text instead: any attention serves."""
    patterns = sorted(set(cfg.layer_patterns()))
    if cfg.architecture != "decoder" or patterns == ["full"]:
        return None
    field = (f"attention_schedule={cfg.attention_schedule!r}" if cfg.attention_schedule
             else f"attention={cfg.attention!r}")
    return field, f"a decoder's prefix LM needs full attention in every layer, not {', '.join(patterns)}"


def build_prefix_lm(model, tokenizer):
    """prefix_lm around `model` with the tokenizer's pad and eos (an encoder-decoder's start: its config)."""
    return prefix_lm(model, tokenizer_pad(tokenizer), tokenizer.special_id("eos"))


register(ObjectiveSpec(name="prefix-lm", build=build_prefix_lm, summary="prefix LM (T5, UniLM)",
                       architectures=("decoder", "encoder-decoder"), tokenizer="gpt2",
                       examples=ExampleFormat("blocks", roles=("eos", "sep")), fits=(full_attention,)))
