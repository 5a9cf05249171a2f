import pytest
import torch
import torch.nn.functional as F

import lmforge

from tests.parity.helpers import assert_parity, padded_batch, save_reference, transformers

ARCHITECTURES = ("DistilBertModel", "DistilBertForMaskedLM", "DistilBertForSequenceClassification",
                 "DistilBertForTokenClassification", "DistilBertForQuestionAnswering")


def _reference(architecture="DistilBertForMaskedLM", **kw):
    torch.manual_seed(0)
    cfg = transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                        max_position_embeddings=64, **kw)
    return getattr(transformers, architecture)(cfg)


def _load(reference, path):
    return lmforge.load(save_reference(reference, path))


@pytest.mark.parametrize("sinusoidal", [False, True])
def test_masked_lm_hidden_states_logits_and_loss(tmp_path, sinusoidal):
    reference = _reference(sinusoidal_pos_embds=sinusoidal)
    model = _load(reference, tmp_path)
    assert model.config.position == ("sinusoidal" if sinusoidal else "learned")
    assert model.config.n_segments == 0
    ids, mask = padded_batch(99)
    labels = torch.where(mask.bool() & (torch.arange(9) % 3 == 0), ids, -100)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels, output_hidden_states=True)
        ours = model(ids, mask)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert_parity(ours.logits, theirs.logits, mask)
    loss = F.cross_entropy(ours.logits.flatten(0, 1), labels.flatten())
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def test_bare_model_with_relu(tmp_path):
    reference = _reference("DistilBertModel", activation="relu")
    model = _load(reference, tmp_path)
    ids, mask = padded_batch(99, seed=3)
    with torch.no_grad():
        assert_parity(model(ids, mask).last_hidden_state, reference(ids, attention_mask=mask).last_hidden_state,
                      mask)


def test_classification_head_is_pre_classifier_relu_classifier(tmp_path):
    reference = _reference("DistilBertForSequenceClassification", num_labels=3)
    model = _load(reference, tmp_path)
    assert model.config.pooler_activation == "relu"
    ids, mask = padded_batch(99, seed=4)
    labels = torch.tensor([2, 0, 1])
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels)
        ours = model(ids, mask).logits
    assert_parity(ours, theirs.logits)
    torch.testing.assert_close(F.cross_entropy(ours, labels), theirs.loss, atol=1e-5, rtol=1e-4)


def test_token_classification_logits_and_loss(tmp_path):
    reference = _reference("DistilBertForTokenClassification", num_labels=4)
    model = _load(reference, tmp_path)
    ids, mask = padded_batch(99, seed=5)
    labels = torch.where(mask.bool(), ids % 4, -100)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels)
        ours = model(ids, mask).logits
    assert_parity(ours, theirs.logits, mask)
    torch.testing.assert_close(F.cross_entropy(ours.flatten(0, 1), labels.flatten()), theirs.loss,
                               atol=1e-5, rtol=1e-4)


def test_question_answering_logits_and_loss(tmp_path):
    reference = _reference("DistilBertForQuestionAnswering")
    model = _load(reference, tmp_path)
    ids, mask = padded_batch(99, seed=6)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask)
        ours = model(ids, mask).logits  # lmforge masks padding out of the answer
    assert_parity(ours[..., 0], theirs.start_logits, mask)
    assert_parity(ours[..., 1], theirs.end_logits, mask)
    full, starts, ends = padded_batch(99, (9, 9), seed=7)[0], torch.tensor([0, 5]), torch.tensor([2, 7])
    with torch.no_grad():
        theirs = reference(full, start_positions=starts, end_positions=ends)
        ours = model(full).logits
    loss = (F.cross_entropy(ours[..., 0], starts) + F.cross_entropy(ours[..., 1], ends)) / 2
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("architecture, sinusoidal", [(a, False) for a in ARCHITECTURES]
                         + [("DistilBertForMaskedLM", True)])
def test_export_round_trip_gives_the_same_state_dicts(tmp_path, architecture, sinusoidal):
    reference = _reference(architecture, sinusoidal_pos_embds=sinusoidal)
    model = _load(reference, tmp_path / "in")
    model.save(tmp_path / "out", format="hf")
    again = getattr(transformers, architecture).from_pretrained(tmp_path / "out").eval()
    ours, theirs = again.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)  # the sinusoids to the bit
    reloaded = lmforge.load(tmp_path / "out").state_dict()
    assert reloaded.keys() == model.state_dict().keys()
    assert all(torch.equal(reloaded[k], v) for k, v in model.state_dict().items())


def test_a_trained_sinusoid_table_loads_as_learned_positions(tmp_path):
    reference = _reference(sinusoidal_pos_embds=True)
    with torch.no_grad():  # the reference keeps the table trainable
        reference.distilbert.embeddings.position_embeddings.weight.add_(0.01)
    model = _load(reference, tmp_path)
    assert model.config.position == "learned"
    ids, mask = padded_batch(99, seed=8)
    with torch.no_grad():
        assert_parity(model(ids, mask).logits, reference(ids, attention_mask=mask).logits, mask)


def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("distilbert-base", position="sinusoidal")).eval()
    attach(model, "classification", n_labels=3)
    model.save(tmp_path, format="hf")
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert type(reference).__name__ == "DistilBertForSequenceClassification"
    ids, mask = padded_batch(99, seed=9)
    with torch.no_grad():
        assert_parity(model(ids, mask).logits, reference(ids, attention_mask=mask).logits)
