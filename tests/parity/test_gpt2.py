import pytest
import torch

import lmforge

from tests.parity.helpers import (BEAM_VARIANTS, assert_beam_parity, assert_causal_lm_parity,
                                  assert_export_round_trip, left_padded_batch, load_reference, padded_batch,
                                  transformers)


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
    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=1, bos_token_id=0,
        eos_token_id=0)).eval()
    assert_beam_parity(load_reference(reference, tmp_path), reference, *left_padded_batch(99), **options)
