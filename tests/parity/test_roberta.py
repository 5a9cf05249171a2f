import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.io import CheckpointError

from tests.parity.helpers import assert_parity, padded_batch, save_reference, transformers

PAD = 1
ARCHITECTURES = ("RobertaModel", "RobertaForMaskedLM", "RobertaForSequenceClassification",
                 "RobertaForTokenClassification", "RobertaForQuestionAnswering")


def _reference(architecture="RobertaForMaskedLM", **kw):
    torch.manual_seed(0)
    cfg = transformers.RobertaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=66, type_vocab_size=1,
                                     layer_norm_eps=1e-5, **kw)
    return getattr(transformers, architecture)(cfg)


def _batch(seed=0, lengths=(9, 6, 3)):
    """Right-padded with the pad token, and no pad id among the real tokens, so the reference's
    input-derived positions equal lmforge's 0, 1, 2, ..."""
    ids, mask = padded_batch(99, lengths, seed)
    return torch.where(mask.bool(), ids.clamp(min=PAD + 1), PAD), mask


def _load(reference, path):
    return lmforge.load(save_reference(reference, path))


def test_config_maps_the_position_offset_and_the_special_tokens(tmp_path):
    model = _load(_reference(), tmp_path)
    cfg = model.config
    assert (cfg.position_offset, cfg.max_seq_len, cfg.n_segments) == (2, 64, 1)
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (1, 0, 2)
    assert model.embed.positions.weight.shape == (66, 32)


def test_masked_lm_hidden_states_logits_and_loss(tmp_path):
    reference = _reference()
    model = _load(reference, tmp_path)
    ids, mask = _batch()
    labels = torch.where(mask.bool() & (torch.arange(9) % 2 == 0), ids, -100)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels, output_hidden_states=True)
        ours = model(ids, mask)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert_parity(ours.logits, theirs.logits, mask)
    loss = F.cross_entropy(ours.logits.flatten(0, 1), labels.flatten())
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def test_left_padding_needs_position_ids_counted_from_the_first_real_token(tmp_path):
    reference = _reference("RobertaModel")
    model = _load(reference, tmp_path)
    ids, mask = _batch(seed=2)
    ids, mask = ids.flip(1), mask.flip(1)  # left-padded: the reference counts positions from the first real token
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask).last_hidden_state
        ours = model(ids, mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).last_hidden_state
        plain = model(ids, mask).last_hidden_state
    assert_parity(ours, theirs, mask)
    assert not torch.allclose(plain[mask.bool()], theirs[mask.bool()], atol=1e-3)


def test_bare_model_with_pooler(tmp_path):
    reference = _reference("RobertaModel", hidden_act="gelu_new")
    model = _load(reference, tmp_path)
    ids, mask = _batch(seed=3)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask)
        ours = model(ids, mask)
    assert_parity(ours.last_hidden_state, theirs.last_hidden_state, mask)
    assert_parity(ours.head_outputs["pooler"], theirs.pooler_output)


def test_lm_head_applies_gelu_whatever_the_hidden_activation(tmp_path):
    reference = _reference(hidden_act="relu")
    model = _load(reference, tmp_path)
    assert model.config.ffn == "relu" and model.config.lm_activation == "gelu"
    ids, mask = _batch(seed=5)
    with torch.no_grad():
        assert_parity(model(ids, mask).logits, reference(ids, attention_mask=mask).logits, mask)


def test_classification_head_is_dense_tanh_out_proj_on_the_first_token(tmp_path):
    reference = _reference("RobertaForSequenceClassification", num_labels=3)
    model = _load(reference, tmp_path)
    ids, mask = _batch(seed=4)
    labels = torch.tensor([0, 2, 1])
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels)
        ours = model(ids, mask).logits
    assert_parity(ours, theirs.logits)
    torch.testing.assert_close(F.cross_entropy(ours, labels), theirs.loss, atol=1e-5, rtol=1e-4)


def test_token_classification_logits_and_loss(tmp_path):
    reference = _reference("RobertaForTokenClassification", num_labels=5)
    model = _load(reference, tmp_path)
    ids, mask = _batch(seed=6)
    labels = torch.where(mask.bool(), ids % 5, -100)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels)
        ours = model(ids, mask).logits
    assert_parity(ours, theirs.logits, mask)
    torch.testing.assert_close(F.cross_entropy(ours.flatten(0, 1), labels.flatten()), theirs.loss,
                               atol=1e-5, rtol=1e-4)


def test_question_answering_logits_and_loss(tmp_path):
    reference = _reference("RobertaForQuestionAnswering")
    model = _load(reference, tmp_path)
    ids, mask = _batch(seed=7)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask)
        ours = model(ids, mask).logits  # (B, T, 2); lmforge masks padding out of the answer
    assert_parity(ours[..., 0], theirs.start_logits, mask)
    assert_parity(ours[..., 1], theirs.end_logits, mask)
    full, starts, ends = _batch(seed=8, lengths=(9, 9, 9))[0], torch.tensor([1, 4, 2]), torch.tensor([3, 4, 8])
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
    reference = _reference(tie_word_embeddings=False)
    with torch.no_grad():  # make the decoder's bias (the one applied) differ from lm_head.bias
        reference.lm_head.decoder.bias.normal_()
    model = _load(reference, tmp_path / "in")
    ids, mask = _batch(seed=9)
    with torch.no_grad():
        assert_parity(model(ids, mask).logits, reference(ids, attention_mask=mask).logits, mask)
    model.save(tmp_path / "out", format="hf")
    again = transformers.RobertaForMaskedLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        assert_parity(again(ids, attention_mask=mask).logits, reference(ids, attention_mask=mask).logits, mask)


def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("roberta-base")).eval()
    attach(model, "classification", n_labels=3)
    model.save(tmp_path, format="hf")
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert type(reference).__name__ == "RobertaForSequenceClassification"
    ids, mask = _batch(seed=10)
    with torch.no_grad():
        assert_parity(model(ids, mask).logits, reference(ids, attention_mask=mask).logits)


@pytest.mark.parametrize("option, value", [("is_decoder", True), ("position_embedding_type", "relative_key")])
def test_unsupported_options_are_refused_by_name(tmp_path, option, value):
    save_reference(_reference("RobertaModel"), tmp_path)
    import json

    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, option: value}))
    with pytest.raises(CheckpointError, match=option):
        lmforge.load(tmp_path)
