import pytest
import torch

import lmforge

from tests.parity.helpers import (assert_export_state_dicts, assert_forward_parity,
                                  assert_logits_and_loss_parity, assert_masked_lm_parity,
                                  assert_question_answering_parity, assert_reference_loads_export,
                                  load_reference, padded_batch, transformers)

ARCHITECTURES = ("DistilBertModel", "DistilBertForMaskedLM", "DistilBertForSequenceClassification",
                 "DistilBertForTokenClassification", "DistilBertForQuestionAnswering")


def _reference(architecture="DistilBertForMaskedLM", **kw):
    torch.manual_seed(0)
    cfg = transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                        max_position_embeddings=64, **kw)
    return getattr(transformers, architecture)(cfg)


@pytest.mark.parametrize("sinusoidal", [False, True])
def test_masked_lm_hidden_states_logits_and_loss(tmp_path, sinusoidal):
    reference = _reference(sinusoidal_pos_embds=sinusoidal)
    model = load_reference(reference, tmp_path)
    assert model.config.position == ("sinusoidal" if sinusoidal else "learned")
    assert model.config.n_segments == 0
    ids, mask = padded_batch(99)
    labels = torch.where(mask.bool() & (torch.arange(9) % 3 == 0), ids, -100)
    assert_masked_lm_parity(model, reference, ids, mask, labels)


def test_bare_model_with_relu(tmp_path):
    reference = _reference("DistilBertModel", activation="relu")
    model = load_reference(reference, tmp_path)
    assert_forward_parity(model, reference, *padded_batch(99, seed=3), "last_hidden_state")


def test_classification_head_is_pre_classifier_relu_classifier(tmp_path):
    reference = _reference("DistilBertForSequenceClassification", num_labels=3)
    model = load_reference(reference, tmp_path)
    assert model.config.pooler_activation == "relu"
    assert_logits_and_loss_parity(model, reference, *padded_batch(99, seed=4), torch.tensor([2, 0, 1]))


def test_token_classification_logits_and_loss(tmp_path):
    reference = _reference("DistilBertForTokenClassification", num_labels=4)
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, seed=5)
    assert_logits_and_loss_parity(model, reference, ids, mask, torch.where(mask.bool(), ids % 4, -100))


def test_question_answering_logits_and_loss(tmp_path):
    reference = _reference("DistilBertForQuestionAnswering")
    model = load_reference(reference, tmp_path)
    full = padded_batch(99, (9, 9), seed=7)[0]
    assert_question_answering_parity(model, reference, *padded_batch(99, seed=6), full, torch.tensor([0, 5]),
                                     torch.tensor([2, 7]))


@pytest.mark.parametrize("architecture, sinusoidal", [(a, False) for a in ARCHITECTURES]
                         + [("DistilBertForMaskedLM", True)])
def test_export_round_trip_gives_the_same_state_dicts(tmp_path, architecture, sinusoidal):
    reference = _reference(architecture, sinusoidal_pos_embds=sinusoidal)
    # the sinusoids to the bit
    assert_export_state_dicts(load_reference(reference, tmp_path / "in"), reference, tmp_path / "out")


def test_a_trained_sinusoid_table_loads_as_learned_positions(tmp_path):
    reference = _reference(sinusoidal_pos_embds=True)
    with torch.no_grad():  # the reference keeps the table trainable
        reference.distilbert.embeddings.position_embeddings.weight.add_(0.01)
    model = load_reference(reference, tmp_path)
    assert model.config.position == "learned"
    assert_forward_parity(model, reference, *padded_batch(99, seed=8))


def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("distilbert-base", position="sinusoidal")).eval()
    attach(model, "classification", n_labels=3)
    ids, mask = padded_batch(99, seed=9)
    auto = transformers.AutoModelForSequenceClassification
    reference = assert_reference_loads_export(model, auto, tmp_path, ids, mask, per_token=False)
    assert type(reference).__name__ == "DistilBertForSequenceClassification"
