"""The config rules of config/checks.py that span fields: here, the width a tied LM head reads."""
from __future__ import annotations

import pytest
import torch

import lmforge
from lmforge.config import ConfigError
from lmforge.heads import make_head


@pytest.mark.parametrize("preset, overrides", [
    ("albert-base", {"lm_transform": False}),  # ALBERT's factorised table, its transform taken away
    ("xlnet-base", {"d_embed": 16}),  # a head without a transform, its table narrowed
    ("gpt2", {"d_embed": 16}),
    ("t5-small", {"d_embed": 16}),
])
def test_a_tied_head_without_a_transform_over_a_narrower_table_is_refused_at_the_config(preset, overrides):
    """tie_embeddings, no lm_transform and d_embed != d_model passed the config and failed in the LM head's
    matmul at the first forward (d_model-wide features against the (V, E) table)."""
    with pytest.raises(ConfigError) as refused:
        lmforge.tiny(preset, **overrides)
    assert refused.value.field == "tie_embeddings"
    message = str(refused.value)
    assert "d_embed=16 != d_model=32" in message and "lm_transform=True" in message
    assert "tie_embeddings=False or d_embed=null" in message and "\n" not in message


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False}, {"d_embed": None}],
                         ids=["transform", "untied", "unfactorised"])
def test_each_way_the_refusal_names_runs_a_forward_through_the_lm_head(overrides):
    """What the message offers instead (ALBERT's transform, an untied decoder, E = d_model) builds and
    gives vocabulary logits."""
    cfg = lmforge.tiny("albert-base", **({"lm_transform": False, **overrides} if overrides else {}))
    model = lmforge.build(cfg).eval()
    model.add_head("lm", make_head(model, "lm"))
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, cfg.vocab_size)
