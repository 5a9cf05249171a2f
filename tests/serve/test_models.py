"""The served model's description (/info): its parameters counted as `lmforge inspect` counts them."""
from __future__ import annotations

import torch

import lmforge
from lmforge.compress.quantize import quantize
from lmforge.heads import attach
from lmforge.pipelines.summary import parameter_counts
from lmforge.serve.models import load_served
from lmforge.tokenizer import train_tokenizer

TEXTS = [f"the {a} {b} sat on the {c}" for a in ("small", "red", "old") for b in ("cat", "dog")
         for c in ("mat", "hill")]


def test_info_counts_an_int8_model_as_inspect_does_heads_excluded(tmp_path):
    tokenizer = train_tokenizer(TEXTS, "wordpiece", 120, family="bert")
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base", vocab_size=tokenizer.vocab_size)).eval()
    attach(model, "classification", n_labels=2)
    backbone = model.num_parameters()  # fp32: heads excluded
    for name, m in (("fp32", model), ("int8", quantize(model))):
        m.save(tmp_path / name)
        tokenizer.save(tmp_path / name)
        info = load_served(name, tmp_path / name).describe()
        loaded = lmforge.load(tmp_path / name)
        assert info["parameters"] == backbone == parameter_counts(loaded)["total"], name  # inspect's total
        assert "heads excluded" in info["parameters_counted"]
