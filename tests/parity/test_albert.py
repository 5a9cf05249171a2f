import pytest
import torch

import lmforge
from lmforge.io import CheckpointError

from tests.parity.helpers import (assert_export_state_dicts, assert_load_refuses,
                                  assert_logits_and_loss_parity, assert_pooler_parity,
                                  assert_pretraining_parity, assert_question_answering_parity,
                                  assert_reference_loads_export, assert_untied_lm_head_round_trip,
                                  load_reference, padded_batch, transformers)

ARCHITECTURES = ("AlbertModel", "AlbertForPreTraining", "AlbertForMaskedLM",
                 "AlbertForSequenceClassification", "AlbertForTokenClassification",
                 "AlbertForQuestionAnswering")


def _reference(architecture="AlbertForPreTraining", **kw):
    torch.manual_seed(0)
    cfg = transformers.AlbertConfig(vocab_size=99, embedding_size=16, hidden_size=32, num_hidden_layers=3,
                                    num_attention_heads=4, intermediate_size=64,
                                    max_position_embeddings=64, **kw)
    return getattr(transformers, architecture)(cfg)


def test_pretraining_model_hidden_states_mlm_sop_and_loss(tmp_path):
    reference = _reference()
    model = load_reference(reference, tmp_path)
    assert model.config.share_layers and model.config.d_embed == 16 and len(model.encoder.blocks) == 1
    ids, mask = padded_batch(99)
    segments = (torch.arange(ids.shape[1]) >= 4).long().expand_as(ids)
    labels = torch.where(mask.bool() & (torch.arange(9) % 2 == 1), ids, -100)
    assert_pretraining_parity(model, reference, ids, mask, segments, labels, torch.tensor([1, 0, 1]), "sop")


def test_bare_model_with_pooler(tmp_path):
    reference = _reference("AlbertModel", hidden_act="gelu")
    assert_pooler_parity(load_reference(reference, tmp_path), reference, *padded_batch(99, seed=3))


def test_masked_lm_logits_and_loss(tmp_path):
    reference = _reference("AlbertForMaskedLM")
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, seed=4)
    assert_logits_and_loss_parity(model, reference, ids, mask, torch.where(mask.bool(), ids, -100))


@pytest.mark.parametrize("architecture, n_labels", [("AlbertForSequenceClassification", 3),
                                                    ("AlbertForTokenClassification", 5)])
def test_classification_logits_and_loss(tmp_path, architecture, n_labels):
    reference = _reference(architecture, num_labels=n_labels)
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, seed=5)
    per_token = architecture.endswith("TokenClassification")
    labels = torch.where(mask.bool(), ids % n_labels, -100) if per_token else torch.tensor([2, 0, 1])
    assert_logits_and_loss_parity(model, reference, ids, mask, labels)


def test_question_answering_logits_and_loss(tmp_path):
    reference = _reference("AlbertForQuestionAnswering")
    model = load_reference(reference, tmp_path)
    full = padded_batch(99, (9, 9), seed=7)[0]
    assert_question_answering_parity(model, reference, *padded_batch(99, seed=6), full, torch.tensor([3, 1]),
                                     torch.tensor([3, 6]))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_export_round_trip_gives_the_same_state_dicts(tmp_path, architecture):
    reference = _reference(architecture)
    assert_export_state_dicts(load_reference(reference, tmp_path / "in"), reference, tmp_path / "out")


def test_untied_lm_head_round_trip(tmp_path):
    reference = _reference("AlbertForMaskedLM", tie_word_embeddings=False)
    with torch.no_grad():  # make the decoder's bias (the one applied) differ from predictions.bias
        reference.predictions.decoder.bias.normal_()
    model = load_reference(reference, tmp_path / "in")
    assert_untied_lm_head_round_trip(model, reference, tmp_path / "out", *padded_batch(99, seed=8))


def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("albert-base")).eval()
    attach(model, "lm")
    reference = assert_reference_loads_export(model, transformers.AutoModelForMaskedLM, tmp_path,
                                              *padded_batch(99, seed=9))
    assert type(reference).__name__ == "AlbertForMaskedLM"


@pytest.mark.parametrize("option, value", [("num_hidden_groups", 2), ("inner_group_num", 2),
                                           ("embedding_size", 32)])
def test_unsupported_options_are_refused_by_name(tmp_path, option, value):
    assert_load_refuses(_reference("AlbertModel"), tmp_path, CheckpointError, option, **{option: value})
