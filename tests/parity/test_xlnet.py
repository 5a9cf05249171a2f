import pytest
import torch

from lmforge.io import CheckpointError

from tests.parity.helpers import (assert_export_state_dicts, assert_forward_parity, assert_load_refuses,
                                  assert_logits_and_loss_parity, assert_masked_lm_parity, assert_parity,
                                  load_reference, padded_batch, transformers)


def _reference(architecture="XLNetLMHeadModel", **kw):
    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(vocab_size=99, d_model=32, n_layer=2, n_head=4, d_inner=64, **kw)
    return getattr(transformers, architecture)(cfg).eval()


def test_lm_hidden_states_logits_and_loss_with_segments(tmp_path):
    reference = _reference()
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99)
    segments = (torch.arange(ids.shape[1]) >= 4).long().expand_as(ids)
    assert_masked_lm_parity(model, reference, ids, mask, ids.masked_fill(mask == 0, -100), segments)


def test_without_segments_the_segment_term_is_absent(tmp_path):
    reference = _reference("XLNetModel", ff_activation="relu")
    model = load_reference(reference, tmp_path)
    assert_forward_parity(model, reference, *padded_batch(99, seed=1), "last_hidden_state")


def test_sequence_classification_summarises_the_last_token_of_left_padded_input(tmp_path):
    reference = _reference("XLNetForSequenceClassification", num_labels=3)
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, seed=2)
    ids, mask = ids.flip(1), mask.flip(1)  # left padding, as XLNet's tokenizer pads
    assert_logits_and_loss_parity(model, reference, ids, mask, torch.tensor([0, 2, 1]))


@pytest.mark.parametrize("architecture", ["XLNetForTokenClassification", "XLNetForQuestionAnsweringSimple"])
def test_token_level_heads(tmp_path, architecture):
    reference = _reference(architecture)
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, seed=3)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask)
        ours = model(ids, mask).logits
    if architecture.endswith("Simple"):
        theirs_logits = torch.stack([theirs.start_logits, theirs.end_logits], -1)
    else:
        theirs_logits = theirs.logits
    assert_parity(ours, theirs_logits, mask)


@pytest.mark.parametrize("architecture", ["XLNetLMHeadModel", "XLNetForSequenceClassification"])
def test_export_round_trip_gives_the_same_state_dict(tmp_path, architecture):
    reference = _reference(architecture)
    assert_export_state_dicts(load_reference(reference, tmp_path / "in"), reference, tmp_path / "out")


@pytest.mark.parametrize("option", [dict(attn_type="uni"), dict(bi_data=True), dict(clamp_len=8),
                                    dict(same_length=True), dict(untie_r=False)])
def test_unsupported_options_are_named(tmp_path, option):
    assert_load_refuses(_reference("XLNetModel", **option), tmp_path, CheckpointError, next(iter(option)))
