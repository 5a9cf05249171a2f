import json

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.io import CheckpointError

from tests.parity.helpers import assert_parity, padded_batch, save_reference, transformers

ARCHITECTURES = ("ElectraModel", "ElectraForPreTraining", "ElectraForMaskedLM", "ElectraForSequenceClassification",
                 "ElectraForTokenClassification", "ElectraForQuestionAnswering")


def _reference(architecture="ElectraForPreTraining", embedding_size=16, **kw):
    torch.manual_seed(0)
    cfg = transformers.ElectraConfig(vocab_size=99, embedding_size=embedding_size, hidden_size=32,
                                     num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=64, **kw)
    return getattr(transformers, architecture)(cfg)


def _load(reference, path):
    return lmforge.load(save_reference(reference, path))


@pytest.mark.parametrize("embedding_size", [16, 32])
def test_discriminator_hidden_states_logits_and_loss(tmp_path, embedding_size):
    reference = _reference(embedding_size=embedding_size)
    model = _load(reference, tmp_path)
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
    model = _load(reference, tmp_path)
    assert model.config.ffn == "gelu-tanh" and model.config.lm_activation == "gelu"
    ids, mask = padded_batch(99, seed=3)
    labels = torch.where(mask.bool() & (torch.arange(9) % 2 == 0), ids, -100)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels)
        ours = model(ids, mask).logits
    assert_parity(ours, theirs.logits, mask)
    torch.testing.assert_close(F.cross_entropy(ours.flatten(0, 1), labels.flatten()), theirs.loss,
                               atol=1e-5, rtol=1e-4)


def test_bare_model(tmp_path):
    reference = _reference("ElectraModel")
    model = _load(reference, tmp_path)
    assert not model.heads
    ids, mask = padded_batch(99, seed=4)
    with torch.no_grad():
        assert_parity(model(ids, mask).last_hidden_state, reference(ids, attention_mask=mask).last_hidden_state,
                      mask)


@pytest.mark.parametrize("architecture, n_labels", [("ElectraForSequenceClassification", 3),
                                                    ("ElectraForTokenClassification", 5)])
def test_classification_logits_and_loss(tmp_path, architecture, n_labels):
    reference = _reference(architecture, num_labels=n_labels)
    model = _load(reference, tmp_path)
    ids, mask = padded_batch(99, seed=5)
    per_token = architecture.endswith("TokenClassification")
    labels = torch.where(mask.bool(), ids % n_labels, -100) if per_token else torch.tensor([2, 0, 1])
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels)
        ours = model(ids, mask).logits
    assert_parity(ours, theirs.logits, mask if per_token else None)
    loss = F.cross_entropy(ours.flatten(0, 1) if per_token else ours, labels.flatten())
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def test_question_answering_logits_and_loss(tmp_path):
    reference = _reference("ElectraForQuestionAnswering")
    model = _load(reference, tmp_path)
    ids, mask = padded_batch(99, seed=6)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask)
        ours = model(ids, mask).logits  # lmforge masks padding out of the answer
    assert_parity(ours[..., 0], theirs.start_logits, mask)
    assert_parity(ours[..., 1], theirs.end_logits, mask)
    full, starts, ends = padded_batch(99, (9, 9), seed=7)[0], torch.tensor([2, 0]), torch.tensor([5, 8])
    with torch.no_grad():
        theirs = reference(full, start_positions=starts, end_positions=ends)
        ours = model(full).logits
    loss = (F.cross_entropy(ours[..., 0], starts) + F.cross_entropy(ours[..., 1], ends)) / 2
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_export_round_trip_gives_the_same_state_dicts(tmp_path, architecture):
    reference = _reference(architecture)
    model = _load(reference, tmp_path / "in")
    model.save(tmp_path / "out", format="hf")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "electra"
    again = getattr(transformers, architecture).from_pretrained(tmp_path / "out").eval()
    ours, theirs = again.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    reloaded = lmforge.load(tmp_path / "out").state_dict()
    assert reloaded.keys() == model.state_dict().keys()
    assert all(torch.equal(reloaded[k], v) for k, v in model.state_dict().items())


def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("electra-small")).eval()
    attach(model, "rtd")
    model.save(tmp_path, format="hf")
    reference = transformers.AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert type(reference).__name__ == "ElectraForPreTraining"
    ids, mask = padded_batch(99, seed=9)
    with torch.no_grad():
        assert_parity(model(ids, mask).logits, reference(ids, attention_mask=mask).logits, mask)


def test_unsupported_options_are_refused_by_name(tmp_path):
    save_reference(_reference("ElectraModel"), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "add_cross_attention": True}))
    with pytest.raises(CheckpointError, match="add_cross_attention"):
        lmforge.load(tmp_path)
