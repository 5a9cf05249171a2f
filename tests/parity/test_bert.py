import torch
import torch.nn.functional as F

import lmforge

from tests.parity.helpers import assert_parity, padded_batch, save_reference, transformers


def _reference(architecture="BertForPreTraining", **kw):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, **kw)
    return getattr(transformers, architecture)(cfg)


def test_pretraining_model_hidden_states_mlm_nsp_and_loss(tmp_path):
    reference = _reference()
    model = lmforge.load(save_reference(reference, tmp_path))
    ids, mask = padded_batch(99)
    segments = (torch.arange(ids.shape[1]) >= 4).long().expand_as(ids)
    labels = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.3, ids, -100)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, token_type_ids=segments, labels=labels,
                           next_sentence_label=torch.tensor([0, 1, 0]), output_hidden_states=True)
        ours = model(ids, mask, segment_ids=segments)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert_parity(ours.head_outputs["lm"], theirs.prediction_logits, mask)
    assert_parity(ours.head_outputs["nsp"], theirs.seq_relationship_logits)
    loss = (F.cross_entropy(ours.head_outputs["lm"].flatten(0, 1), labels.flatten())
            + F.cross_entropy(ours.head_outputs["nsp"], torch.tensor([0, 1, 0])))
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def test_bare_model_with_pooler(tmp_path):
    reference = _reference("BertModel", hidden_act="gelu_new", type_vocab_size=3)
    model = lmforge.load(save_reference(reference, tmp_path))
    ids, mask = padded_batch(99, seed=3)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask)
        ours = model(ids, mask)
    assert_parity(ours.last_hidden_state, theirs.last_hidden_state, mask)
    assert_parity(ours.head_outputs["pooler"], theirs.pooler_output)


def test_classification_model(tmp_path):
    reference = _reference("BertForSequenceClassification", num_labels=3)
    model = lmforge.load(save_reference(reference, tmp_path))
    ids, mask = padded_batch(99, seed=4)
    with torch.no_grad():
        assert_parity(model(ids, mask).logits, reference(ids, attention_mask=mask).logits)


def test_export_round_trip_gives_the_same_state_dict(tmp_path):
    reference = _reference()
    model = lmforge.load(save_reference(reference, tmp_path / "in"))
    model.save(tmp_path / "out", format="hf")
    again = transformers.BertForPreTraining.from_pretrained(tmp_path / "out").eval()
    ours, theirs = again.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("bert-base")).eval()
    attach(model, "classification", n_labels=3)
    model.save(tmp_path, format="hf")
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    ids, mask = padded_batch(99, seed=5)
    with torch.no_grad():
        assert_parity(model(ids, mask).logits, reference(ids, attention_mask=mask).logits)


def test_export_refuses_a_config_bert_cannot_express(tmp_path):
    import pytest

    from lmforge.convert import ConversionError

    model = lmforge.build(lmforge.tiny("bert-base", norm_placement="pre"))
    with pytest.raises(ConversionError, match="no Hugging Face family expresses"):
        model.save(tmp_path, format="hf")


def test_untied_lm_head_uses_the_decoders_own_bias(tmp_path):
    reference = _reference("BertForMaskedLM", tie_word_embeddings=False)
    with torch.no_grad():  # make the two bias tensors differ, as training an untied model does
        reference.cls.predictions.decoder.bias.normal_()
    model = lmforge.load(save_reference(reference, tmp_path / "in"))
    ids, mask = padded_batch(99, seed=5)
    with torch.no_grad():
        assert_parity(model(ids, mask).logits, reference(ids, attention_mask=mask).logits, mask)
    model.save(tmp_path / "out", format="hf")
    again = transformers.BertForMaskedLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        assert_parity(again(ids, attention_mask=mask).logits, reference(ids, attention_mask=mask).logits, mask)
