import pytest
import torch

import lmforge

from tests.parity.helpers import (BEAM_VARIANTS, assert_beam_parity, assert_causal_lm_parity,
                                  assert_export_round_trip, assert_forward_parity,
                                  assert_logits_and_loss_parity, assert_question_answering_parity,
                                  left_padded_batch, load_reference, assert_load_refuses, padded_batch,
                                  transformers)


def _pair(tmp_path, architecture: str, **overrides):
    torch.manual_seed(0)
    reference = getattr(transformers, architecture)(transformers.GPT2Config(
        vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=1, bos_token_id=0,
        eos_token_id=0, **overrides)).eval()
    return reference, load_reference(reference, tmp_path / "reference")


def test_lm_hidden_states_logits_and_loss(tmp_path):
    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0))
    assert_causal_lm_parity(load_reference(reference, tmp_path), reference, *padded_batch(99))


def test_export_round_trip(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("gpt2")).eval()
    attach(model, "lm")
    ids, mask = padded_batch(99, seed=2)
    assert_export_round_trip(model, transformers.GPT2LMHeadModel, tmp_path / "hf", ids, mask)


@pytest.mark.parametrize("options", BEAM_VARIANTS)
def test_beam_search_on_a_left_padded_batch(tmp_path, options):
    reference, model = _pair(tmp_path, "GPT2LMHeadModel")
    assert_beam_parity(model, reference, *left_padded_batch(99), **options)


def test_sequence_classification_scores_the_last_real_token(tmp_path):
    reference, model = _pair(tmp_path, "GPT2ForSequenceClassification", num_labels=3)
    assert model.heads["classification"].spec["pooling"] == "last"
    ids, mask = padded_batch(99, seed=2, pad=1)  # the reference finds the last real token by pad id
    assert_logits_and_loss_parity(model, reference, ids, mask, torch.tensor([0, 2, 1]),
                                  atol=1e-5, rtol=1.3e-6)


def test_token_classification_and_question_answering(tmp_path):
    reference, model = _pair(tmp_path / "tok", "GPT2ForTokenClassification", num_labels=5)
    assert_forward_parity(model, reference, *padded_batch(99, seed=3, pad=1), per_token=True)
    reference, model = _pair(tmp_path / "qa", "GPT2ForQuestionAnswering")
    assert_question_answering_parity(model, reference, *padded_batch(99, seed=4))


@pytest.mark.parametrize("architecture", ["GPT2ForSequenceClassification", "GPT2ForTokenClassification"])
def test_export_round_trip_of_an_imported_head(tmp_path, architecture):
    reference, model = _pair(tmp_path, architecture)
    ids, mask = padded_batch(99, seed=5, pad=1)
    assert_export_round_trip(model, type(reference), tmp_path / "hf", ids, mask, reference)


@pytest.mark.parametrize("option, value", [("scale_attn_weights", False),
                                           ("scale_attn_by_inverse_layer_idx", True),
                                           ("reorder_and_upcast_attn", True)])
def test_attention_scaling_options_lmforge_lacks_are_refused_by_name(tmp_path, option, value):
    from lmforge.config import ConfigError
    from lmforge.convert import load_hf

    reference = transformers.GPT2Model(transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4,
                                                               n_positions=64, **{option: value}))
    assert_load_refuses(reference, tmp_path, ConfigError, f"{option}=", load=load_hf)
