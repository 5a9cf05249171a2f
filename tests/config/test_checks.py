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
def test_a_tied_head_without_a_transform_over_a_narrower_table_is_refused_as_it_is_built(preset, overrides):
    """tie_embeddings, no lm_transform and d_embed != d_model built an LM head that failed in its matmul at
    the first forward (d_model-wide features against the (V, E) table)."""
    model = lmforge.build(lmforge.tiny(preset, **overrides))
    with pytest.raises(ConfigError) as refused:
        make_head(model, "lm")
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


@pytest.mark.parametrize("preset", ["gpt2", "xlnet-base"])
def test_such_a_model_with_a_classifier_and_no_lm_head_is_valid(preset):
    """No LM head reads the tied table: a classifier of d_embed=16 (tie_embeddings as its preset has it)
    builds and runs; refused at the config, such a model (and a folder saved of one) was refused whole."""
    model = lmforge.build(lmforge.tiny(preset, d_embed=16)).eval()
    model.add_head("classification", make_head(model, "classification", n_labels=2))
    with torch.no_grad():
        logits = model(torch.tensor([[5, 6, 7]])).logits
    assert logits.shape == (1, 2)


def test_an_xlnet_discriminator_over_a_narrower_table_trains_by_replaced_token_detection():
    """The discriminator has no LM head; its generator, narrower than the table, takes ELECTRA's transform
    (objectives/rtd.py generator_config): a step runs."""
    from lmforge.objectives import ReplacedTokenDetection

    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("xlnet-base", d_embed=16))
    objective = ReplacedTokenDetection(model, mask_id=3, ratio=0.25)
    assert objective.generator.lm.tied is model.tokens and objective.generator.lm.transform.out_features == 16
    examples = [{"input_ids": [1, *range(5, 20), 2]} for _ in range(2)]
    batch = objective.collate([objective.corrupt(e, torch.Generator().manual_seed(i))
                               for i, e in enumerate(examples)])
    loss = objective(batch).loss
    loss.backward()
    assert torch.isfinite(loss)
