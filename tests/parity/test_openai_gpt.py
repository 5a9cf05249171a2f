import pytest
import torch

import lmforge
from lmforge.config import ConfigError
from lmforge.convert import load_hf
from tests.parity.helpers import (
    assert_causal_lm_parity,
    assert_export_round_trip,
    assert_parity,
    padded_batch,
    save_reference,
    transformers,
)


def gpt_config(**overrides):
    """A tiny GPT (post-norm, learned positions, feed-forward 4 d_model)."""
    fields = {"vocab_size": 99, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64,
              "pad_token_id": 1}
    return transformers.OpenAIGPTConfig(**{**fields, **overrides})


def _pair(tmp_path, architecture="OpenAIGPTLMHeadModel", **overrides):
    torch.manual_seed(0)
    reference = getattr(transformers, architecture)(gpt_config(**overrides)).eval()
    return reference, lmforge.load(save_reference(reference, tmp_path / "reference"))


@pytest.mark.parametrize("afn", ["gelu", "relu"])
def test_lm_hidden_states_logits_and_loss(tmp_path, afn):
    reference, model = _pair(tmp_path, afn=afn)
    assert model.config.norm_placement == "post" and not model.config.has_final_norm
    assert_causal_lm_parity(model, reference, *padded_batch(99))


def test_base_model_hidden_states(tmp_path):
    reference, model = _pair(tmp_path, "OpenAIGPTModel")
    ids, mask = padded_batch(99, seed=1)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask).last_hidden_state
        assert_parity(model(ids, mask).last_hidden_state, theirs, mask)


def test_sequence_classification_scores_the_last_real_token(tmp_path):
    reference, model = _pair(tmp_path, "OpenAIGPTForSequenceClassification", num_labels=3)
    ids, mask = padded_batch(99, seed=2)
    ids = ids.masked_fill(mask == 0, 1)  # the reference finds the last real token by pad id
    labels = torch.tensor([0, 2, 1])
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels)
        ours = model(ids, mask).logits
    assert_parity(ours, theirs.logits)
    torch.testing.assert_close(torch.nn.functional.cross_entropy(ours, labels), theirs.loss)


@pytest.mark.parametrize("architecture", ["OpenAIGPTLMHeadModel", "OpenAIGPTForSequenceClassification"])
def test_export_round_trip_of_an_imported_model(tmp_path, architecture):
    reference, model = _pair(tmp_path, architecture)
    ids, mask = padded_batch(99, seed=3)
    ids = ids.masked_fill(mask == 0, 1)
    reference_class = getattr(transformers, architecture)
    assert_export_round_trip(model, reference_class, tmp_path / "hf", ids, mask, reference)


def test_export_of_the_tiny_preset(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("openai-gpt", d_ff=128)).eval()  # the reference fixes 4 d_model
    attach(model, "lm")
    ids, mask = padded_batch(99, seed=4)
    assert_export_round_trip(model, transformers.OpenAIGPTLMHeadModel, tmp_path / "hf", ids, mask)


def test_unsupported_activation_is_refused(tmp_path):
    reference = transformers.OpenAIGPTModel(gpt_config(afn="silu"))
    with pytest.raises(ConfigError, match="afn"):
        load_hf(save_reference(reference, tmp_path))
