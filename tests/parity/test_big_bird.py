import pytest
import torch

import lmforge
from lmforge.io import CheckpointError

from tests.parity.helpers import (assert_export_round_trip, assert_export_state_dicts, assert_load_refuses,
                                  assert_logits_and_loss_parity, assert_masked_lm_parity, assert_parity,
                                  assert_pooler_parity, assert_pretraining_parity,
                                  assert_reference_loads_export, assert_span_logits_parity,
                                  assert_span_loss_parity, assert_untied_lm_head_round_trip, load_reference,
                                  padded_batch, transformers)

LONG = (38, 31, 20)  # 10 blocks of 4: block-sparse (more than (5 + 2r) * b = 28 tokens), last block partial
SHORT = (13, 9, 5)  # at most 28 tokens: the reference falls back to full attention


def _reference(architecture="BigBirdForMaskedLM", attention_type="block_sparse", **kw):
    torch.manual_seed(0)
    kw = {"block_size": 4, "num_random_blocks": 1, **kw}
    cfg = transformers.BigBirdConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                                     attention_type=attention_type, **kw)
    return getattr(transformers, architecture)(cfg)


def _labels(ids, mask, seed=1):
    pick = torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed)) < 0.3
    return torch.where(pick & mask.bool(), ids, -100)


def test_config_maps_both_attention_types(tmp_path):
    cfg = load_reference(_reference(), tmp_path / "sparse").config
    assert (cfg.attention, cfg.block_size, cfg.n_random_blocks) == ("bigbird", 4, 1)
    assert (cfg.random_block_choice, cfg.dense_max_len, cfg.ffn, cfg.pooler_activation) == (
        "first", 28, "gelu-tanh", "tanh")
    reference = _reference("BigBirdForSequenceClassification", "original_full")
    cfg = load_reference(reference, tmp_path / "full").config
    assert (cfg.dense_max_len, cfg.max_seq_len, cfg.pooler_activation) == (64, 64, "gelu-tanh")


@pytest.mark.parametrize("attention_type,lengths", [("original_full", SHORT), ("block_sparse", LONG)])
def test_pretraining_hidden_states_mlm_nsp_and_loss(tmp_path, attention_type, lengths):
    reference = _reference("BigBirdForPreTraining", attention_type)
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, lengths)
    segments = (torch.arange(ids.shape[1]) >= 4).long().expand_as(ids)
    labels, nsp = _labels(ids, mask), torch.tensor([0, 1, 0])
    assert_pretraining_parity(model, reference, ids, mask, segments, labels, nsp)


@pytest.mark.parametrize("block_size,n_random_blocks,lengths",
                         [(4, 1, SHORT), (4, 1, LONG), (2, 2, (37, 30, 11))])
def test_block_sparse_masked_lm_at_short_and_long_lengths(tmp_path, block_size, n_random_blocks, lengths):
    reference = _reference(block_size=block_size, num_random_blocks=n_random_blocks)
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, lengths, seed=2)
    # a fresh reference each time: a short input switches it to full attention for good
    assert_masked_lm_parity(model, reference, ids, mask, _labels(ids, mask, seed=3))


def test_the_repeated_first_block_matters():
    """Not vacuous: with the reference's layout the first block weighs 1 + r, which changes the outputs."""
    cfg = lmforge.tiny("bigbird-base", n_random_blocks=1, random_block_choice="first", dense_max_len=28)
    model = lmforge.build(cfg).eval()
    plain = lmforge.build(cfg.replace(n_random_blocks=0))
    plain.load_state_dict(model.state_dict())
    ids, mask = padded_batch(99, LONG)
    with torch.no_grad():
        gap = (model(ids, mask).last_hidden_state - plain.eval()(ids, mask).last_hidden_state)[mask.bool()]
    assert gap.abs().max() > 1e-3


def test_bare_model_with_pooler_and_rescaled_embeddings(tmp_path):
    reference = _reference("BigBirdModel", hidden_act="gelu", rescale_embeddings=True)
    model = load_reference(reference, tmp_path)
    assert model.config.scale_embeddings
    assert_pooler_parity(model, reference, *padded_batch(99, LONG, seed=4))


def test_classification_head_uses_hidden_act(tmp_path):
    reference = _reference("BigBirdForSequenceClassification", num_labels=3)
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, LONG, seed=5)
    assert_logits_and_loss_parity(model, reference, ids, mask, torch.tensor([2, 0, 1]))


def test_token_classification_logits_and_loss(tmp_path):
    reference = _reference("BigBirdForTokenClassification", num_labels=5)
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, LONG, seed=6)
    labels = torch.randint(0, 5, ids.shape, generator=torch.Generator().manual_seed(2))
    assert_logits_and_loss_parity(model, reference, ids, mask, labels.masked_fill(mask == 0, -100))


def test_question_answering_head_and_loss(tmp_path):
    reference = _reference("BigBirdForQuestionAnswering", sep_token_id=3)
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, LONG, seed=7)
    ids = ids.clamp(min=4)  # no sep token: no question mask; segments given explicitly
    segments = (torch.arange(ids.shape[1]) >= 5).long().expand_as(ids)
    one = torch.ones(3, 1, dtype=torch.long)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, token_type_ids=segments, question_lengths=one)
        ours = model(ids, mask, segment_ids=segments).logits
    assert_span_logits_parity(ours, theirs, mask)
    full = torch.ones_like(mask)  # the loss without padding, which the reference does not mask
    start, end = torch.tensor([6, 9, 5]), torch.tensor([8, 9, 12])
    with torch.no_grad():
        theirs = reference(ids, attention_mask=full, token_type_ids=segments, question_lengths=one,
                           start_positions=start, end_positions=end)
        ours = model(ids, full, segment_ids=segments).logits
    assert_span_loss_parity(ours, start, end, theirs.loss)


def test_question_answering_outside_the_reference_question_mask(tmp_path):
    """Given no question lengths the reference masks the question (up to the first sep token)
    and makes what follows segment 1; lmforge agrees everywhere else when given those segments."""
    reference = _reference("BigBirdForQuestionAnswering", sep_token_id=3)
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, LONG, seed=8)
    ids = ids.clamp(min=4)
    ids[:, 4] = 3  # the question is tokens 0-4
    context = torch.arange(ids.shape[1]) >= 5
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask)
        ours = model(ids, mask, segment_ids=context.long().expand_as(ids)).logits
    keep = mask.bool() & (context | (torch.arange(ids.shape[1]) == 0))
    assert_parity(ours[..., 0][keep], theirs.start_logits[keep])
    assert (theirs.start_logits[:, 1:5] < -1e5).all()


@pytest.mark.parametrize("architecture", ["BigBirdForMaskedLM", "BigBirdForSequenceClassification",
                                          "BigBirdForTokenClassification"])
def test_export_round_trip(tmp_path, architecture):
    reference = _reference(architecture)
    model = load_reference(reference, tmp_path / "in")
    ids, mask = padded_batch(99, LONG, seed=9)
    assert_export_round_trip(model, type(reference), tmp_path / "out", ids, mask, reference)


@pytest.mark.parametrize("architecture",
                         ["BigBirdModel", "BigBirdForPreTraining", "BigBirdForQuestionAnswering"])
def test_export_round_trip_of_the_other_architectures(tmp_path, architecture):
    attention_type = "original_full" if architecture == "BigBirdModel" else "block_sparse"
    reference = _reference(architecture, attention_type)
    model = load_reference(reference, tmp_path / "in")
    back = assert_export_state_dicts(model, reference, tmp_path / "out")
    assert back.config.attention_type == reference.config.attention_type


def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path):
    from lmforge.heads import attach

    cfg = lmforge.tiny("bigbird-base", n_random_blocks=1, random_block_choice="first", dense_max_len=28,
                       pooler_activation="gelu-tanh")
    model = lmforge.build(cfg).eval()
    attach(model, "classification", n_labels=3)
    attach(model, "pooler")  # the reference's classification checkpoints keep an (unused) pooler
    assert_reference_loads_export(model, transformers.AutoModelForSequenceClassification, tmp_path,
                                  *padded_batch(99, LONG, seed=10), per_token=False)


def test_export_refuses_lmforge_random_blocks(tmp_path):
    from lmforge.convert import ConversionError

    model = lmforge.build(lmforge.tiny("bigbird-base"))  # seeded random blocks: not the reference's layout
    with pytest.raises(ConversionError, match="no Hugging Face family"):
        model.save(tmp_path, format="hf")


def test_unsupported_options_are_refused_by_name(tmp_path):
    assert_load_refuses(_reference("BigBirdModel", use_bias=False), tmp_path, CheckpointError, "use_bias")


def test_untied_lm_head_uses_the_decoders_own_bias(tmp_path):
    reference = _reference(tie_word_embeddings=False)
    with torch.no_grad():  # make the two bias tensors differ, as training an untied model does
        reference.cls.predictions.bias.normal_()
        reference.cls.predictions.decoder.bias.normal_()
    model = load_reference(reference, tmp_path / "in")
    assert_untied_lm_head_round_trip(model, reference, tmp_path / "out", *padded_batch(99, seed=5))


@pytest.mark.parametrize("lengths", [(28, 1, 13), (29, 1, 28), (33, 4, 30)])
def test_blocked_attention_matches_on_either_side_of_the_full_attention_length(tmp_path, lengths):
    """fast/blocked.py's block chunks as the reference, at dense_max_len = 28 and just above it, with a
    one-token row, and with a last block of one token (33 = 8 blocks of 4 + 1)."""
    from lmforge.fast.paths import FastPaths

    reference = _reference()
    model = lmforge.optimize(load_reference(reference, tmp_path), paths=FastPaths(local_attention="blocked"))
    ids, mask = padded_batch(99, lengths, seed=11)
    assert_masked_lm_parity(model, reference, ids, mask, _labels(ids, mask, seed=12))
