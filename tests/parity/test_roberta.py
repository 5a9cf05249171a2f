import pytest
import torch

import lmforge
from lmforge.io import CheckpointError

from tests.parity.helpers import (assert_export_state_dicts, assert_forward_parity, assert_load_refuses,
                                  assert_logits_and_loss_parity, assert_masked_lm_parity, assert_parity,
                                  assert_pooler_parity, assert_question_answering_parity,
                                  assert_reference_loads_export, assert_untied_lm_head_round_trip,
                                  load_reference, padded_batch, transformers)

PAD = 1
ARCHITECTURES = ("RobertaModel", "RobertaForMaskedLM", "RobertaForSequenceClassification",
                 "RobertaForTokenClassification", "RobertaForQuestionAnswering")


def _reference(architecture="RobertaForMaskedLM", **kw):
    torch.manual_seed(0)
    cfg = transformers.RobertaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=66,
                                     type_vocab_size=1, layer_norm_eps=1e-5, **kw)
    return getattr(transformers, architecture)(cfg)


def _batch(seed=0, lengths=(9, 6, 3)):
    """Right-padded with the pad token, and no pad id among the real tokens, so the reference's
    input-derived positions equal lmforge's 0, 1, 2, ..."""
    ids, mask = padded_batch(99, lengths, seed)
    return torch.where(mask.bool(), ids.clamp(min=PAD + 1), PAD), mask


def test_config_maps_the_position_offset_and_the_special_tokens(tmp_path):
    model = load_reference(_reference(), tmp_path)
    cfg = model.config
    assert (cfg.position_offset, cfg.max_seq_len, cfg.n_segments) == (2, 64, 1)
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (1, 0, 2)
    assert model.embed.positions.weight.shape == (66, 32)


def test_masked_lm_hidden_states_logits_and_loss(tmp_path):
    reference = _reference()
    model = load_reference(reference, tmp_path)
    ids, mask = _batch()
    labels = torch.where(mask.bool() & (torch.arange(9) % 2 == 0), ids, -100)
    assert_masked_lm_parity(model, reference, ids, mask, labels)


def test_left_padding_reads_the_references_positions_counted_from_the_pad_ids(tmp_path):
    """The reference derives positions from the padding (position_from_padding): a left-padded row reads
    what the reference reads, plain and optimized, with no position_ids."""
    reference = _reference("RobertaModel")
    model = load_reference(reference, tmp_path)
    assert model.config.position_from_padding
    ids, mask = _batch(seed=2)
    ids, mask = ids.flip(1), mask.flip(1)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask).last_hidden_state
        plain = model(ids, mask).last_hidden_state
        lmforge.optimize(model)
        fast = model(ids, mask).last_hidden_state
    assert_parity(plain, theirs, mask)
    assert_parity(fast, theirs, mask)
    with torch.no_grad():  # no mask: the positions (and the reference's) come from the pad ids alone
        unmasked = model(ids).last_hidden_state
        theirs = reference(ids).last_hidden_state
    assert_parity(unmasked, theirs, mask)


def test_positions_from_padding_need_an_offset():
    """The field names itself where the padding row would not exist."""
    with pytest.raises(lmforge.ConfigError, match="position_from_padding"):
        lmforge.build("bert-base", n_layers=1, position_from_padding=True)  # position_offset 0


def test_bare_model_with_pooler(tmp_path):
    reference = _reference("RobertaModel", hidden_act="gelu_new")
    assert_pooler_parity(load_reference(reference, tmp_path), reference, *_batch(seed=3))


def test_lm_head_applies_gelu_whatever_the_hidden_activation(tmp_path):
    reference = _reference(hidden_act="relu")
    model = load_reference(reference, tmp_path)
    assert model.config.ffn == "relu" and model.config.lm_activation == "gelu"
    assert_forward_parity(model, reference, *_batch(seed=5))


def test_classification_head_is_dense_tanh_out_proj_on_the_first_token(tmp_path):
    reference = _reference("RobertaForSequenceClassification", num_labels=3)
    model = load_reference(reference, tmp_path)
    assert_logits_and_loss_parity(model, reference, *_batch(seed=4), torch.tensor([0, 2, 1]))


def test_token_classification_logits_and_loss(tmp_path):
    reference = _reference("RobertaForTokenClassification", num_labels=5)
    model = load_reference(reference, tmp_path)
    ids, mask = _batch(seed=6)
    assert_logits_and_loss_parity(model, reference, ids, mask, torch.where(mask.bool(), ids % 5, -100))


def test_question_answering_logits_and_loss(tmp_path):
    reference = _reference("RobertaForQuestionAnswering")
    model = load_reference(reference, tmp_path)
    full = _batch(seed=8, lengths=(9, 9, 9))[0]
    assert_question_answering_parity(model, reference, *_batch(seed=7), full, torch.tensor([1, 4, 2]),
                                     torch.tensor([3, 4, 8]))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_export_round_trip_gives_the_same_state_dicts(tmp_path, architecture):
    reference = _reference(architecture)
    assert_export_state_dicts(load_reference(reference, tmp_path / "in"), reference, tmp_path / "out")


def test_untied_lm_head_round_trip(tmp_path):
    reference = _reference(tie_word_embeddings=False)
    with torch.no_grad():  # make the decoder's bias (the one applied) differ from lm_head.bias
        reference.lm_head.decoder.bias.normal_()
    model = load_reference(reference, tmp_path / "in")
    assert_untied_lm_head_round_trip(model, reference, tmp_path / "out", *_batch(seed=9))


def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("roberta-base")).eval()
    attach(model, "classification", n_labels=3)
    auto = transformers.AutoModelForSequenceClassification
    reference = assert_reference_loads_export(model, auto, tmp_path, *_batch(seed=10), per_token=False)
    assert type(reference).__name__ == "RobertaForSequenceClassification"


@pytest.mark.parametrize("option, value", [("is_decoder", True), ("position_embedding_type", "relative_key")])
def test_unsupported_options_are_refused_by_name(tmp_path, option, value):
    assert_load_refuses(_reference("RobertaModel"), tmp_path, CheckpointError, option, **{option: value})
