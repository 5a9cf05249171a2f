import json

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.io import CheckpointError

from tests.parity.helpers import assert_parity, padded_batch, save_reference, transformers

ARCHITECTURES = ("AlbertModel", "AlbertForPreTraining", "AlbertForMaskedLM", "AlbertForSequenceClassification",
                 "AlbertForTokenClassification", "AlbertForQuestionAnswering")


def _reference(architecture="AlbertForPreTraining", **kw):
    torch.manual_seed(0)
    cfg = transformers.AlbertConfig(vocab_size=99, embedding_size=16, hidden_size=32, num_hidden_layers=3,
                                    num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, **kw)
    return getattr(transformers, architecture)(cfg)


def _load(reference, path):
    return lmforge.load(save_reference(reference, path))


def test_pretraining_model_hidden_states_mlm_sop_and_loss(tmp_path):
    reference = _reference()
    model = _load(reference, tmp_path)
    assert model.config.share_layers and model.config.d_embed == 16 and len(model.encoder.blocks) == 1
    ids, mask = padded_batch(99)
    segments = (torch.arange(ids.shape[1]) >= 4).long().expand_as(ids)
    labels = torch.where(mask.bool() & (torch.arange(9) % 2 == 1), ids, -100)
    order = torch.tensor([1, 0, 1])
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, token_type_ids=segments, labels=labels,
                           sentence_order_label=order, output_hidden_states=True)
        ours = model(ids, mask, segment_ids=segments)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert_parity(ours.head_outputs["lm"], theirs.prediction_logits, mask)
    assert_parity(ours.head_outputs["sop"], theirs.sop_logits)
    loss = (F.cross_entropy(ours.head_outputs["lm"].flatten(0, 1), labels.flatten())
            + F.cross_entropy(ours.head_outputs["sop"], order))
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def test_bare_model_with_pooler(tmp_path):
    reference = _reference("AlbertModel", hidden_act="gelu")
    model = _load(reference, tmp_path)
    ids, mask = padded_batch(99, seed=3)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask)
        ours = model(ids, mask)
    assert_parity(ours.last_hidden_state, theirs.last_hidden_state, mask)
    assert_parity(ours.head_outputs["pooler"], theirs.pooler_output)


def test_masked_lm_logits_and_loss(tmp_path):
    reference = _reference("AlbertForMaskedLM")
    model = _load(reference, tmp_path)
    ids, mask = padded_batch(99, seed=4)
    labels = torch.where(mask.bool(), ids, -100)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels)
        ours = model(ids, mask).logits
    assert_parity(ours, theirs.logits, mask)
    torch.testing.assert_close(F.cross_entropy(ours.flatten(0, 1), labels.flatten()), theirs.loss,
                               atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("architecture, n_labels", [("AlbertForSequenceClassification", 3),
                                                    ("AlbertForTokenClassification", 5)])
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
    reference = _reference("AlbertForQuestionAnswering")
    model = _load(reference, tmp_path)
    ids, mask = padded_batch(99, seed=6)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask)
        ours = model(ids, mask).logits  # lmforge masks padding out of the answer
    assert_parity(ours[..., 0], theirs.start_logits, mask)
    assert_parity(ours[..., 1], theirs.end_logits, mask)
    full, starts, ends = padded_batch(99, (9, 9), seed=7)[0], torch.tensor([3, 1]), torch.tensor([3, 6])
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
    again = getattr(transformers, architecture).from_pretrained(tmp_path / "out").eval()
    ours, theirs = again.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    reloaded = lmforge.load(tmp_path / "out").state_dict()
    assert reloaded.keys() == model.state_dict().keys()
    assert all(torch.equal(reloaded[k], v) for k, v in model.state_dict().items())


def test_untied_lm_head_round_trip(tmp_path):
    reference = _reference("AlbertForMaskedLM", tie_word_embeddings=False)
    with torch.no_grad():  # make the decoder's bias (the one applied) differ from predictions.bias
        reference.predictions.decoder.bias.normal_()
    model = _load(reference, tmp_path / "in")
    ids, mask = padded_batch(99, seed=8)
    with torch.no_grad():
        assert_parity(model(ids, mask).logits, reference(ids, attention_mask=mask).logits, mask)
    model.save(tmp_path / "out", format="hf")
    again = transformers.AlbertForMaskedLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        assert_parity(again(ids, attention_mask=mask).logits, reference(ids, attention_mask=mask).logits, mask)


def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("albert-base")).eval()
    attach(model, "lm")
    model.save(tmp_path, format="hf")
    reference = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(reference).__name__ == "AlbertForMaskedLM"
    ids, mask = padded_batch(99, seed=9)
    with torch.no_grad():
        assert_parity(model(ids, mask).logits, reference(ids, attention_mask=mask).logits, mask)


@pytest.mark.parametrize("option, value", [("num_hidden_groups", 2), ("inner_group_num", 2),
                                           ("embedding_size", 32)])
def test_unsupported_options_are_refused_by_name(tmp_path, option, value):
    save_reference(_reference("AlbertModel"), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, option: value}))
    with pytest.raises(CheckpointError, match=option):
        lmforge.load(tmp_path)
