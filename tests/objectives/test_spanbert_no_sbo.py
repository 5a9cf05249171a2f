"""Span masking without SBO: SpanBERT's spans, the masked-LM loss alone, no SBO weights."""
from __future__ import annotations

import torch

import lmforge
from lmforge.objectives.spanbert import SpanMLM
from lmforge.objectives.spanbert_no_sbo import SpanMaskedLM

MASK, CLS, SEP = 3, 1, 2


def test_spans_as_spanbert_loss_of_the_masked_lm_alone():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base"))
    with_sbo = SpanMLM(model, MASK, special_ids=(CLS, SEP))
    without = SpanMaskedLM(model, MASK, special_ids=(CLS, SEP))
    assert not any("sbo" in name for name, _ in without.named_parameters())
    ids = [CLS] + list(range(10, 40)) + [SEP]
    example = {"input_ids": ids, "segment_ids": [0] * len(ids), "word_starts": [1] * len(ids)}
    a = with_sbo.corrupt(example, torch.Generator().manual_seed(3))
    b = without.corrupt(example, torch.Generator().manual_seed(3))
    assert a == b  # the same spans from the same draws
    batch = without.collate([b])
    model.eval()
    hidden = model(batch["input_ids"], batch["attention_mask"], run_heads=False).last_hidden_state
    expected = without.mlm_loss(hidden, batch["labels"]).loss
    assert torch.allclose(without(batch).loss, expected)
