import pytest
import torch

import lmforge

from tests.parity.helpers import (assert_export_state_dicts, assert_forward_parity, assert_load_refuses,
                                  assert_pooler_parity, assert_pretraining_parity,
                                  assert_reference_loads_export, assert_untied_lm_head_round_trip,
                                  load_reference, padded_batch, transformers)


def _reference(architecture="BertForPreTraining", **kw):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, **kw)
    return getattr(transformers, architecture)(cfg)


def test_pretraining_model_hidden_states_mlm_nsp_and_loss(tmp_path):
    reference = _reference()
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99)
    segments = (torch.arange(ids.shape[1]) >= 4).long().expand_as(ids)
    labels = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.3, ids, -100)
    assert_pretraining_parity(model, reference, ids, mask, segments, labels, torch.tensor([0, 1, 0]))


@pytest.mark.parametrize("act", ["gelu_new", "gelu_python", "gelu_fast", "gelu_pytorch_tanh", "relu"])
def test_bare_model_with_pooler(tmp_path, act):
    reference = _reference("BertModel", hidden_act=act, type_vocab_size=3)
    assert_pooler_parity(load_reference(reference, tmp_path), reference, *padded_batch(99, seed=3))


def test_classification_model(tmp_path):
    reference = _reference("BertForSequenceClassification", num_labels=3)
    model = load_reference(reference, tmp_path)
    assert_forward_parity(model, reference, *padded_batch(99, seed=4), per_token=False)


def test_export_round_trip_gives_the_same_state_dict(tmp_path):
    reference = _reference()
    assert_export_state_dicts(load_reference(reference, tmp_path / "in"), reference, tmp_path / "out")


def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("bert-base")).eval()
    attach(model, "classification", n_labels=3)
    assert_reference_loads_export(model, transformers.AutoModelForSequenceClassification, tmp_path,
                                  *padded_batch(99, seed=5), per_token=False)


def test_export_refuses_a_config_bert_cannot_express(tmp_path):
    from lmforge.convert import ConversionError

    model = lmforge.build(lmforge.tiny("bert-base", norm_placement="pre"))
    with pytest.raises(ConversionError, match="no Hugging Face family expresses"):
        model.save(tmp_path, format="hf")


def test_untied_lm_head_uses_the_decoders_own_bias(tmp_path):
    reference = _reference("BertForMaskedLM", tie_word_embeddings=False)
    with torch.no_grad():  # make the two bias tensors differ, as training an untied model does
        reference.cls.predictions.decoder.bias.normal_()
    model = load_reference(reference, tmp_path / "in")
    assert_untied_lm_head_round_trip(model, reference, tmp_path / "out", *padded_batch(99, seed=5))


@pytest.mark.parametrize("option, value", [("is_decoder", True), ("position_embedding_type", "relative_key")])
def test_options_of_a_decoder_or_relative_positions_are_refused_by_name(tmp_path, option, value):
    from lmforge.config import ConfigError
    from lmforge.convert import load_hf

    reference = _reference("BertForMaskedLM", **{option: value})
    assert_load_refuses(reference, tmp_path, ConfigError, option, load=load_hf)
