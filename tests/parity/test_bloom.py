import pytest
import torch

import lmforge
from lmforge.config import ConfigError
from lmforge.convert import load_hf
from lmforge.convert.keymap import FIXES, INVERSES
from tests.parity.helpers import (assert_causal_lm_parity, assert_export_round_trip, assert_forward_parity,
                                  assert_greedy_parity, assert_load_refuses, assert_question_answering_parity,
                                  left_padded_batch, load_reference, padded_batch, transformers)


def bloom_config(**overrides):
    """A tiny BLOOM (ALiBi, embedding LayerNorm, per-head fused qkv)."""
    fields = {"vocab_size": 99, "hidden_size": 32, "n_layer": 2, "n_head": 4, "pad_token_id": 1,
              "bos_token_id": 2, "eos_token_id": 3}
    return transformers.BloomConfig(**{**fields, **overrides})


def _pair(tmp_path, architecture="BloomForCausalLM", **overrides):
    torch.manual_seed(0)
    reference = getattr(transformers, architecture)(bloom_config(**overrides)).eval()
    return reference, load_reference(reference, tmp_path / "reference")


def test_qkv_per_head_regroups_rows_and_inverts():
    n_heads, d_head = 3, 2
    # reference rows are (head, q/k/v, d); label each row by 100 * q/k/v + 10 * head + d
    rows = torch.tensor([[100.0 * s + 10 * h + d]
                         for h in range(n_heads) for s in range(3) for d in range(d_head)])
    ours = FIXES["qkv_per_head"](rows, n_heads)
    expected = [100.0 * s + 10 * h + d for s in range(3) for h in range(n_heads) for d in range(d_head)]
    assert ours.flatten().tolist() == expected  # [q of every head; k ...; v ...]
    assert torch.equal(INVERSES["qkv_per_head"](ours, n_heads), rows)


# 4 heads: the ALiBi slopes of a power of two; 6 heads: the interleaved extra slopes
@pytest.mark.parametrize("overrides", [{}, {"hidden_size": 48, "n_head": 6, "tie_word_embeddings": False}])
def test_causal_lm_hidden_states_logits_and_loss(tmp_path, overrides):
    reference, model = _pair(tmp_path, **overrides)
    assert model.config.position == "alibi" and model.config.embedding_norm
    assert_causal_lm_parity(model, reference, *padded_batch(99))


@pytest.mark.parametrize("architecture", ["BloomModel", "BloomForSequenceClassification",
                                          "BloomForTokenClassification"])
def test_base_and_classification_models(tmp_path, architecture):
    reference, model = _pair(tmp_path, architecture, num_labels=3)
    # the reference finds the last real token by pad id
    ids, mask = padded_batch(99, seed=1, pad=1)
    if architecture == "BloomModel":
        assert_forward_parity(model, reference, ids, mask, "last_hidden_state")
    else:
        per_token = architecture.endswith("TokenClassification")
        assert_forward_parity(model, reference, ids, mask, per_token=per_token)


def test_question_answering_start_and_end_logits(tmp_path):
    reference, model = _pair(tmp_path, "BloomForQuestionAnswering")
    assert_question_answering_parity(model, reference, *padded_batch(99, seed=2))


@pytest.mark.parametrize("architecture", ["BloomForCausalLM", "BloomForSequenceClassification"])
def test_export_round_trip_of_an_imported_model(tmp_path, architecture):
    reference, model = _pair(tmp_path, architecture)
    ids, mask = padded_batch(99, seed=3, pad=1)
    assert_export_round_trip(model, type(reference), tmp_path / "hf", ids, mask, reference)


def test_export_of_the_tiny_preset(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("bloom-560m", d_ff=128)).eval()  # the reference fixes 4 d_model
    attach(model, "lm")
    assert_export_round_trip(model, transformers.BloomForCausalLM, tmp_path / "hf", *padded_batch(99, seed=4))


def test_greedy_generation_on_a_left_padded_batch(tmp_path):
    reference, model = _pair(tmp_path)
    ids, mask = left_padded_batch(99, pad=1)
    assert_greedy_parity(model, reference, ids, mask)


def test_residual_after_the_norm_is_refused(tmp_path):
    reference = transformers.BloomModel(bloom_config(apply_residual_connection_post_layernorm=True))
    option = "apply_residual_connection_post_layernorm"
    assert_load_refuses(reference, tmp_path, ConfigError, option, load=load_hf)


def test_sliced_projections_without_biases_are_refused(tmp_path):
    reference = transformers.BloomModel(bloom_config(pretraining_tp=2, slow_but_exact=True))
    assert_load_refuses(reference, tmp_path, ConfigError, "slow_but_exact", load=load_hf)


def test_tensor_parallel_degree_alone_loads_with_parity(tmp_path):
    torch.manual_seed(0)
    reference = transformers.BloomForCausalLM(bloom_config(pretraining_tp=2)).eval()
    assert_causal_lm_parity(load_reference(reference, tmp_path), reference, *padded_batch(99))
