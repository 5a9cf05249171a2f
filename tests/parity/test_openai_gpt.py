import pytest
import torch

import lmforge
from lmforge.config import ConfigError
from lmforge.convert import load_hf
from tests.parity.helpers import (assert_causal_lm_parity, assert_export_round_trip, assert_forward_parity,
                                  assert_load_refuses, assert_logits_and_loss_parity, load_reference,
                                  padded_batch, transformers)


def gpt_config(**overrides):
    """A tiny GPT (post-norm, learned positions, feed-forward 4 d_model)."""
    fields = {"vocab_size": 99, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64,
              "pad_token_id": 1}
    return transformers.OpenAIGPTConfig(**{**fields, **overrides})


def _pair(tmp_path, architecture="OpenAIGPTLMHeadModel", **overrides):
    torch.manual_seed(0)
    reference = getattr(transformers, architecture)(gpt_config(**overrides)).eval()
    return reference, load_reference(reference, tmp_path / "reference")


@pytest.mark.parametrize("afn", ["gelu", "relu"])
def test_lm_hidden_states_logits_and_loss(tmp_path, afn):
    reference, model = _pair(tmp_path, afn=afn)
    assert model.config.norm_placement == "post" and not model.config.has_final_norm
    assert_causal_lm_parity(model, reference, *padded_batch(99))


def test_base_model_hidden_states(tmp_path):
    reference, model = _pair(tmp_path, "OpenAIGPTModel")
    assert_forward_parity(model, reference, *padded_batch(99, seed=1), "last_hidden_state")


def test_sequence_classification_scores_the_last_real_token(tmp_path):
    reference, model = _pair(tmp_path, "OpenAIGPTForSequenceClassification", num_labels=3)
    # the reference finds the last real token by pad id
    ids, mask = padded_batch(99, seed=2, pad=1)
    labels = torch.tensor([0, 2, 1])
    # the loss at assert_close's own float32 tolerances
    assert_logits_and_loss_parity(model, reference, ids, mask, labels, atol=1e-5, rtol=1.3e-6)


@pytest.mark.parametrize("architecture", ["OpenAIGPTLMHeadModel", "OpenAIGPTForSequenceClassification"])
def test_export_round_trip_of_an_imported_model(tmp_path, architecture):
    reference, model = _pair(tmp_path, architecture)
    ids, mask = padded_batch(99, seed=3, pad=1)
    assert_export_round_trip(model, type(reference), tmp_path / "hf", ids, mask, reference)


def test_export_of_the_tiny_preset(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("openai-gpt", d_ff=128)).eval()  # the reference fixes 4 d_model
    attach(model, "lm")
    ids, mask = padded_batch(99, seed=4)
    assert_export_round_trip(model, transformers.OpenAIGPTLMHeadModel, tmp_path / "hf", ids, mask)


def test_unsupported_activation_is_refused(tmp_path):
    reference = transformers.OpenAIGPTModel(gpt_config(afn="silu"))
    assert_load_refuses(reference, tmp_path, ConfigError, "afn", load=load_hf)
