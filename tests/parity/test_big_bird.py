import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.io import CheckpointError

from tests.parity.helpers import (assert_export_round_trip, assert_parity, padded_batch, save_reference,
                                  transformers)

LONG = (38, 31, 20)  # 10 blocks of 4: block-sparse (more than (5 + 2r) * b = 28 tokens), last block partial
SHORT = (13, 9, 5)  # at most 28 tokens: the reference falls back to full attention


def _reference(architecture="BigBirdForMaskedLM", attention_type="block_sparse", **kw):
    torch.manual_seed(0)
    kw = {"block_size": 4, "num_random_blocks": 1, **kw}
    cfg = transformers.BigBirdConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                                     attention_type=attention_type, **kw)
    return getattr(transformers, architecture)(cfg)


def _load(reference, path):
    return lmforge.load(save_reference(reference, path))


def _labels(ids, mask, seed=1):
    pick = torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed)) < 0.3
    return torch.where(pick & mask.bool(), ids, -100)


def _same_state(want, got):
    want, got = want.state_dict(), got.state_dict()
    assert sorted(want) == sorted(got)
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_config_maps_both_attention_types(tmp_path):
    cfg = _load(_reference(), tmp_path / "sparse").config
    assert (cfg.attention, cfg.block_size, cfg.n_random_blocks) == ("bigbird", 4, 1)
    assert (cfg.random_block_choice, cfg.dense_max_len, cfg.ffn, cfg.pooler_activation) == (
        "first", 28, "gelu-tanh", "tanh")
    cfg = _load(_reference("BigBirdForSequenceClassification", "original_full"), tmp_path / "full").config
    assert (cfg.dense_max_len, cfg.max_seq_len, cfg.pooler_activation) == (64, 64, "gelu-tanh")


@pytest.mark.parametrize("attention_type,lengths", [("original_full", SHORT), ("block_sparse", LONG)])
def test_pretraining_hidden_states_mlm_nsp_and_loss(tmp_path, attention_type, lengths):
    reference = _reference("BigBirdForPreTraining", attention_type)
    model = _load(reference, tmp_path)
    ids, mask = padded_batch(99, lengths)
    segments = (torch.arange(ids.shape[1]) >= 4).long().expand_as(ids)
    labels, nsp = _labels(ids, mask), torch.tensor([0, 1, 0])
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, token_type_ids=segments, labels=labels,
                           next_sentence_label=nsp, output_hidden_states=True)
        ours = model(ids, mask, segment_ids=segments)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert_parity(ours.head_outputs["lm"], theirs.prediction_logits, mask)
    assert_parity(ours.head_outputs["nsp"], theirs.seq_relationship_logits)
    loss = (F.cross_entropy(ours.head_outputs["lm"].flatten(0, 1), labels.flatten())
            + F.cross_entropy(ours.head_outputs["nsp"], nsp))
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("block_size,n_random_blocks,lengths",
                         [(4, 1, SHORT), (4, 1, LONG), (2, 2, (37, 30, 11))])
def test_block_sparse_masked_lm_at_short_and_long_lengths(tmp_path, block_size, n_random_blocks, lengths):
    reference = _reference(block_size=block_size, num_random_blocks=n_random_blocks)
    model = _load(reference, tmp_path)
    ids, mask = padded_batch(99, lengths, seed=2)
    labels = _labels(ids, mask, seed=3)
    with torch.no_grad():  # a fresh reference each time: a short input switches it to full attention for good
        theirs = reference(ids, attention_mask=mask, labels=labels, output_hidden_states=True)
        ours = model(ids, mask)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert_parity(ours.logits, theirs.logits, mask)
    torch.testing.assert_close(F.cross_entropy(ours.logits.flatten(0, 1), labels.flatten()), theirs.loss,
                               atol=1e-5, rtol=1e-4)


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
    model = _load(reference, tmp_path)
    assert model.config.scale_embeddings
    ids, mask = padded_batch(99, LONG, seed=4)
    with torch.no_grad():
        theirs, ours = reference(ids, attention_mask=mask), model(ids, mask)
    assert_parity(ours.last_hidden_state, theirs.last_hidden_state, mask)
    assert_parity(ours.head_outputs["pooler"], theirs.pooler_output)


def test_classification_head_uses_hidden_act(tmp_path):
    reference = _reference("BigBirdForSequenceClassification", num_labels=3)
    model = _load(reference, tmp_path)
    ids, mask = padded_batch(99, LONG, seed=5)
    labels = torch.tensor([2, 0, 1])
    with torch.no_grad():
        theirs, ours = reference(ids, attention_mask=mask, labels=labels), model(ids, mask)
    assert_parity(ours.logits, theirs.logits)
    torch.testing.assert_close(F.cross_entropy(ours.logits, labels), theirs.loss, atol=1e-5, rtol=1e-4)


def test_token_classification_logits_and_loss(tmp_path):
    reference = _reference("BigBirdForTokenClassification", num_labels=5)
    model = _load(reference, tmp_path)
    ids, mask = padded_batch(99, LONG, seed=6)
    labels = torch.randint(0, 5, ids.shape, generator=torch.Generator().manual_seed(2))
    labels = labels.masked_fill(mask == 0, -100)
    with torch.no_grad():
        theirs, ours = reference(ids, attention_mask=mask, labels=labels), model(ids, mask)
    assert_parity(ours.logits, theirs.logits, mask)
    loss = F.cross_entropy(ours.logits.flatten(0, 1), labels.flatten())
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def test_question_answering_head_and_loss(tmp_path):
    reference = _reference("BigBirdForQuestionAnswering", sep_token_id=3)
    model = _load(reference, tmp_path)
    ids, mask = padded_batch(99, LONG, seed=7)
    ids = ids.clamp(min=4)  # no sep token: no question mask; segments given explicitly
    segments = (torch.arange(ids.shape[1]) >= 5).long().expand_as(ids)
    one = torch.ones(3, 1, dtype=torch.long)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, token_type_ids=segments, question_lengths=one)
        ours = model(ids, mask, segment_ids=segments).logits
    assert_parity(ours[..., 0], theirs.start_logits, mask)
    assert_parity(ours[..., 1], theirs.end_logits, mask)
    full = torch.ones_like(mask)  # the loss without padding, which the reference does not mask
    start, end = torch.tensor([6, 9, 5]), torch.tensor([8, 9, 12])
    with torch.no_grad():
        theirs = reference(ids, attention_mask=full, token_type_ids=segments, question_lengths=one,
                           start_positions=start, end_positions=end)
        ours = model(ids, full, segment_ids=segments).logits
    loss = (F.cross_entropy(ours[..., 0], start) + F.cross_entropy(ours[..., 1], end)) / 2
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def test_question_answering_outside_the_reference_question_mask(tmp_path):
    """Given no question lengths the reference masks the question (up to the first sep token)
    and makes what follows segment 1; lmforge agrees everywhere else when given those segments."""
    reference = _reference("BigBirdForQuestionAnswering", sep_token_id=3)
    model = _load(reference, tmp_path)
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
    model = _load(reference, tmp_path / "in")
    ids, mask = padded_batch(99, LONG, seed=9)
    reference_class = getattr(transformers, architecture)
    assert_export_round_trip(model, reference_class, tmp_path / "out", ids, mask, reference)


@pytest.mark.parametrize("architecture",
                         ["BigBirdModel", "BigBirdForPreTraining", "BigBirdForQuestionAnswering"])
def test_export_round_trip_of_the_other_architectures(tmp_path, architecture):
    attention_type = "original_full" if architecture == "BigBirdModel" else "block_sparse"
    reference = _reference(architecture, attention_type)
    model = _load(reference, tmp_path / "in")
    model.save(tmp_path / "out", format="hf")
    back = getattr(transformers, architecture).from_pretrained(tmp_path / "out").eval()
    assert back.config.attention_type == reference.config.attention_type
    _same_state(reference, back)
    _same_state(model, lmforge.load(tmp_path / "out"))


def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path):
    from lmforge.heads import attach

    cfg = lmforge.tiny("bigbird-base", n_random_blocks=1, random_block_choice="first", dense_max_len=28,
                       pooler_activation="gelu-tanh")
    model = lmforge.build(cfg).eval()
    attach(model, "classification", n_labels=3)
    attach(model, "pooler")  # the reference's classification checkpoints keep an (unused) pooler
    model.save(tmp_path, format="hf")
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    ids, mask = padded_batch(99, LONG, seed=10)
    with torch.no_grad():
        assert_parity(model(ids, mask).logits, reference(ids, attention_mask=mask).logits)


def test_export_refuses_lmforge_random_blocks(tmp_path):
    from lmforge.convert import ConversionError

    model = lmforge.build(lmforge.tiny("bigbird-base"))  # seeded random blocks: not the reference's layout
    with pytest.raises(ConversionError, match="no Hugging Face family"):
        model.save(tmp_path, format="hf")


def test_unsupported_options_are_refused_by_name(tmp_path):
    save_reference(_reference("BigBirdModel", use_bias=False), tmp_path)
    with pytest.raises(CheckpointError, match="use_bias"):
        lmforge.load(tmp_path)
