import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.io import CheckpointError

from tests.parity.helpers import assert_parity, padded_batch, save_reference, transformers


def _reference(architecture="XLNetLMHeadModel", **kw):
    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(vocab_size=99, d_model=32, n_layer=2, n_head=4, d_inner=64, **kw)
    return getattr(transformers, architecture)(cfg).eval()


def test_lm_hidden_states_logits_and_loss_with_segments(tmp_path):
    reference = _reference()
    model = lmforge.load(save_reference(reference, tmp_path))
    ids, mask = padded_batch(99)
    segments = (torch.arange(ids.shape[1]) >= 4).long().expand_as(ids)
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, token_type_ids=segments, labels=labels,
                           output_hidden_states=True)
        ours = model(ids, mask, segment_ids=segments)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert_parity(ours.logits, theirs.logits, mask)
    torch.testing.assert_close(F.cross_entropy(ours.logits.flatten(0, 1), labels.flatten()), theirs.loss,
                               atol=1e-5, rtol=1e-4)


def test_without_segments_the_segment_term_is_absent(tmp_path):
    reference = _reference("XLNetModel", ff_activation="relu")
    model = lmforge.load(save_reference(reference, tmp_path))
    ids, mask = padded_batch(99, seed=1)
    with torch.no_grad():
        assert_parity(model(ids, mask).last_hidden_state, reference(ids, attention_mask=mask).last_hidden_state,
                      mask)


def test_sequence_classification_summarises_the_last_token_of_left_padded_input(tmp_path):
    reference = _reference("XLNetForSequenceClassification", num_labels=3)
    model = lmforge.load(save_reference(reference, tmp_path))
    ids, mask = padded_batch(99, seed=2)
    ids, mask = ids.flip(1), mask.flip(1)  # left padding, as XLNet's tokenizer pads
    labels = torch.tensor([0, 2, 1])
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels)
        ours = model(ids, mask)
    assert_parity(ours.logits, theirs.logits)
    torch.testing.assert_close(F.cross_entropy(ours.logits, labels), theirs.loss, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("architecture", ["XLNetForTokenClassification", "XLNetForQuestionAnsweringSimple"])
def test_token_level_heads(tmp_path, architecture):
    reference = _reference(architecture)
    model = lmforge.load(save_reference(reference, tmp_path))
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
    model = lmforge.load(save_reference(reference, tmp_path / "in"))
    model.save(tmp_path / "out", format="hf")
    again = getattr(transformers, architecture).from_pretrained(tmp_path / "out").eval()
    ours, theirs = again.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    back = lmforge.load(tmp_path / "out")
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("option", [dict(attn_type="uni"), dict(bi_data=True), dict(clamp_len=8),
                                    dict(same_length=True), dict(untie_r=False)])
def test_unsupported_options_are_named(tmp_path, option):
    save_reference(_reference("XLNetModel", **option), tmp_path)
    with pytest.raises(CheckpointError, match=next(iter(option))):
        lmforge.load(tmp_path)
