import json

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.io import CheckpointError

from tests.parity.helpers import (assert_export_state_dicts, assert_forward_parity, assert_load_refuses,
                                  assert_logits_and_loss_parity, assert_parity,
                                  assert_question_answering_parity, assert_reference_loads_export,
                                  load_reference, padded_batch, transformers)

ARCHITECTURES = ("ElectraModel", "ElectraForPreTraining", "ElectraForMaskedLM",
                 "ElectraForSequenceClassification", "ElectraForTokenClassification",
                 "ElectraForQuestionAnswering")


def _reference(architecture="ElectraForPreTraining", embedding_size=16, **kw):
    torch.manual_seed(0)
    cfg = transformers.ElectraConfig(vocab_size=99, embedding_size=embedding_size, hidden_size=32,
                                     num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=64, **kw)
    return getattr(transformers, architecture)(cfg)


@pytest.mark.parametrize("embedding_size", [16, 32])
def test_discriminator_hidden_states_logits_and_loss(tmp_path, embedding_size):
    reference = _reference(embedding_size=embedding_size)
    model = load_reference(reference, tmp_path)
    assert (model.embed.project is not None) == (embedding_size != 32)
    ids, mask = padded_batch(99)
    segments = (torch.arange(ids.shape[1]) >= 5).long().expand_as(ids)
    replaced = (ids % 3 == 0).long()
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, token_type_ids=segments, labels=replaced,
                           output_hidden_states=True)
        ours = model(ids, mask, segment_ids=segments)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert ours.logits.shape == ids.shape  # one logit per token
    assert_parity(ours.logits, theirs.logits, mask)
    keep = mask.bool()  # the reference's loss covers the real tokens only
    loss = F.binary_cross_entropy_with_logits(ours.logits[keep], replaced[keep].float())
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def test_generator_masked_lm_applies_gelu_whatever_the_hidden_activation(tmp_path):
    reference = _reference("ElectraForMaskedLM", hidden_act="gelu_new")
    model = load_reference(reference, tmp_path)
    assert model.config.ffn == "gelu-tanh" and model.config.lm_activation == "gelu"
    ids, mask = padded_batch(99, seed=3)
    labels = torch.where(mask.bool() & (torch.arange(9) % 2 == 0), ids, -100)
    assert_logits_and_loss_parity(model, reference, ids, mask, labels)


def test_bare_model(tmp_path):
    reference = _reference("ElectraModel")
    model = load_reference(reference, tmp_path)
    assert not model.heads
    assert_forward_parity(model, reference, *padded_batch(99, seed=4), "last_hidden_state")


@pytest.mark.parametrize("architecture, n_labels", [("ElectraForSequenceClassification", 3),
                                                    ("ElectraForTokenClassification", 5)])
def test_classification_logits_and_loss(tmp_path, architecture, n_labels):
    reference = _reference(architecture, num_labels=n_labels)
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, seed=5)
    per_token = architecture.endswith("TokenClassification")
    labels = torch.where(mask.bool(), ids % n_labels, -100) if per_token else torch.tensor([2, 0, 1])
    assert_logits_and_loss_parity(model, reference, ids, mask, labels)


def test_question_answering_logits_and_loss(tmp_path):
    reference = _reference("ElectraForQuestionAnswering")
    model = load_reference(reference, tmp_path)
    full = padded_batch(99, (9, 9), seed=7)[0]
    assert_question_answering_parity(model, reference, *padded_batch(99, seed=6), full, torch.tensor([2, 0]),
                                     torch.tensor([5, 8]))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_export_round_trip_gives_the_same_state_dicts(tmp_path, architecture):
    reference = _reference(architecture)
    assert_export_state_dicts(load_reference(reference, tmp_path / "in"), reference, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "electra"


def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("electra-small")).eval()
    attach(model, "rtd")
    reference = assert_reference_loads_export(model, transformers.AutoModelForPreTraining, tmp_path,
                                              *padded_batch(99, seed=9))
    assert type(reference).__name__ == "ElectraForPreTraining"


def test_unsupported_options_are_refused_by_name(tmp_path):
    assert_load_refuses(_reference("ElectraModel"), tmp_path, CheckpointError, "add_cross_attention",
                        add_cross_attention=True)
