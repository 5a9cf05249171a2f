import pytest
import torch

import lmforge
from lmforge.heads import attach
from tests.parity.helpers import (assert_causal_lm_parity, assert_export_round_trip, assert_forward_parity,
                                  assert_greedy_parity, left_padded_batch, load_reference, padded_batch,
                                  transformers)


def mistral_config(**overrides):
    """A tiny Mistral: GQA and a 4-token sliding window, shorter than the 9-token test sequences."""
    fields = {"vocab_size": 99, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
              "sliding_window": 4, "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 3}
    return transformers.MistralConfig(**{**fields, **overrides})


def _pair(tmp_path, architecture="MistralForCausalLM", **overrides):
    torch.manual_seed(0)
    reference = getattr(transformers, architecture)(mistral_config(**overrides)).eval()
    return reference, load_reference(reference, tmp_path / "reference")


def test_sliding_window_maps_to_the_same_band(tmp_path):
    reference, model = _pair(tmp_path)
    assert (model.config.attention, model.config.window) == ("sliding-window", 4)
    ids, mask = padded_batch(99)  # lengths 9, 6, 3: the window binds in the first two rows
    assert_causal_lm_parity(model, reference, ids, mask)
    # the comparison is sensitive to the window: one key more or less changes the outputs
    for window in (3, 5):
        other = lmforge.from_config(model.config.replace(window=window), init=False)
        attach(other, "lm")
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            assert not torch.allclose(other(ids, mask).logits[0, -1], model(ids, mask).logits[0, -1])


def test_no_window_is_full_attention(tmp_path):
    reference, model = _pair(tmp_path, sliding_window=None, tie_word_embeddings=True)
    assert model.config.attention == "full"
    assert_causal_lm_parity(model, reference, *padded_batch(99, seed=1))


@pytest.mark.parametrize("architecture", ["MistralModel", "MistralForSequenceClassification",
                                          "MistralForTokenClassification"])
def test_base_and_classification_models(tmp_path, architecture):
    reference, model = _pair(tmp_path, architecture, num_labels=3)
    # the reference finds the last real token by pad id
    ids, mask = padded_batch(99, seed=2, pad=1)
    if architecture == "MistralModel":
        assert_forward_parity(model, reference, ids, mask, "last_hidden_state")
    else:
        per_token = architecture.endswith("TokenClassification")
        assert_forward_parity(model, reference, ids, mask, per_token=per_token)


def test_export_round_trip_of_an_imported_model(tmp_path):
    reference, model = _pair(tmp_path)
    ids, mask = padded_batch(99, seed=3)
    assert_export_round_trip(model, transformers.MistralForCausalLM, tmp_path / "hf", ids, mask, reference)


def test_export_of_the_tiny_preset(tmp_path):
    model = lmforge.build(lmforge.tiny("mistral-7b", window=4)).eval()
    attach(model, "lm")
    ids, mask = padded_batch(99, seed=4)
    assert_export_round_trip(model, transformers.MistralForCausalLM, tmp_path / "hf", ids, mask)
    assert transformers.AutoConfig.from_pretrained(tmp_path / "hf").sliding_window == 4


def test_greedy_generation_on_a_left_padded_batch(tmp_path):
    reference, model = _pair(tmp_path)
    ids, mask = left_padded_batch(99, pad=1)  # prompts of 7 tokens and 20 new ones: past the window
    assert_greedy_parity(model, reference, ids, mask)
