import pytest
import torch

import lmforge
from lmforge.io import CheckpointError

from tests.parity.helpers import (assert_export_round_trip, assert_load_refuses,
                                  assert_logits_and_loss_parity, assert_loss_parity, assert_parity,
                                  assert_reference_loads_export, assert_span_logits_parity,
                                  assert_span_loss_parity, load_reference, padded_batch, transformers)

PAD = 1
LENGTHS = (13, 9, 5)  # longer than every window: the reference pads to a multiple of it internally


def _reference(architecture="LongformerForMaskedLM", attention_window=(4, 8), **kw):
    torch.manual_seed(0)
    cfg = transformers.LongformerConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=64,
                                        max_position_embeddings=66, type_vocab_size=1,
                                        layer_norm_eps=1e-5, attention_window=list(attention_window), **kw)
    return getattr(transformers, architecture)(cfg)


def _batch(seed=0, lengths=LENGTHS):
    """Right-padded with the pad token and no pad id among the real tokens (RoBERTa's positions)."""
    ids, mask = padded_batch(99, lengths, seed)
    return torch.where(mask.bool(), ids.clamp(min=PAD + 1), PAD), mask


def _global_tokens():
    """Row 0: <s> and a token outside every window; row 1: <s>; row 2: none."""
    glob = torch.zeros(len(LENGTHS), max(LENGTHS), dtype=torch.long)
    glob[0, [0, 11]] = 1
    glob[1, 0] = 1
    return glob


def _run(model, reference, ids, mask, glob, **labels):
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, global_attention_mask=glob, output_hidden_states=True,
                           **labels)
        ours = model(ids, mask, global_tokens=glob)  # the same 0/1 mask
    return ours, theirs


def test_config_maps_windows_offset_and_default_global_tokens(tmp_path):
    cfg = load_reference(_reference(), tmp_path / "mlm").config
    assert (cfg.attention, cfg.window_schedule, cfg.global_projections) == ("longformer", [4, 8], True)
    assert (cfg.position_offset, cfg.max_seq_len, cfg.n_global_tokens) == (2, 64, 0)
    assert cfg.lm_activation == "gelu"  # the reference's LM head applies gelu whatever hidden_act says
    cfg = load_reference(_reference("LongformerForSequenceClassification", (8, 8)), tmp_path / "cls").config
    assert (cfg.window, cfg.window_schedule, cfg.n_global_tokens) == (8, None, 1)


@pytest.mark.parametrize("with_global", [False, True])
def test_masked_lm_hidden_states_logits_and_loss(tmp_path, with_global):
    reference = _reference()
    model = load_reference(reference, tmp_path)
    ids, mask = _batch()
    labels = torch.where(mask.bool() & (torch.arange(ids.shape[1]) % 2 == 0), ids, -100)
    ours, theirs = _run(model, reference, ids, mask, _global_tokens() if with_global else None, labels=labels)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert_parity(ours.logits, theirs.logits, mask)
    assert_loss_parity(ours.logits, labels, theirs.loss)


def test_global_tokens_change_the_outputs():
    """Not vacuous: the global rows and the tokens outside their windows really differ."""
    model = lmforge.build(lmforge.tiny("longformer-base", window=4, n_global_tokens=0)).eval()
    ids, mask = _batch()
    with torch.no_grad():
        local = model(ids, mask).last_hidden_state
        glob = model(ids, mask, global_tokens=_global_tokens().bool()).last_hidden_state
    assert (local[0, 0] - glob[0, 0]).abs().max() > 1e-3
    assert (local[0, 6] - glob[0, 6]).abs().max() > 1e-3  # sees token 11 only globally


def test_bare_model_with_pooler_and_global_tokens(tmp_path):
    reference = _reference("LongformerModel", (6, 6), hidden_act="gelu_new")
    model = load_reference(reference, tmp_path)
    ids, mask = _batch(seed=3)
    ours, theirs = _run(model, reference, ids, mask, _global_tokens())
    assert_parity(ours.last_hidden_state, theirs.last_hidden_state, mask)
    assert_parity(ours.head_outputs["pooler"], theirs.pooler_output)


def test_classification_makes_the_first_token_global_by_default(tmp_path):
    reference = _reference("LongformerForSequenceClassification", num_labels=3)
    model = load_reference(reference, tmp_path)
    # no global mask on either side: both make <s> global
    assert_logits_and_loss_parity(model, reference, *_batch(seed=4), torch.tensor([0, 2, 1]))


def test_token_classification_logits_and_loss(tmp_path):
    reference = _reference("LongformerForTokenClassification", num_labels=5)
    model = load_reference(reference, tmp_path)
    ids, mask = _batch(seed=5)
    labels = torch.randint(0, 5, ids.shape, generator=torch.Generator().manual_seed(2))
    labels = labels.masked_fill(mask == 0, -100)
    ours, theirs = _run(model, reference, ids, mask, _global_tokens(), labels=labels)
    assert_parity(ours.logits, theirs.logits, mask)
    assert_loss_parity(ours.logits, labels, theirs.loss)


def test_question_answering_with_global_question_tokens(tmp_path):
    reference = _reference("LongformerForQuestionAnswering")
    model = load_reference(reference, tmp_path)
    ids, mask = _batch(seed=6)
    glob = torch.zeros_like(ids)
    glob[:, :3] = 1  # the question
    ours, theirs = _run(model, reference, ids, mask, glob)  # lmforge also masks padding out of the answer
    assert_span_logits_parity(ours.logits, theirs, mask)
    ids, full = _batch(seed=9, lengths=(13,) * 3)  # the loss without padding, which the reference scores
    start, end = torch.tensor([4, 5, 3]), torch.tensor([6, 8, 4])
    ours, theirs = _run(model, reference, ids, full, glob, start_positions=start, end_positions=end)
    assert_span_loss_parity(ours.logits, start, end, theirs.loss)


def test_export_round_trip_gives_the_same_state_dict_and_outputs(tmp_path):
    reference = _reference()
    model = load_reference(reference, tmp_path / "in")
    ids, mask = _batch(seed=7)
    back = assert_export_round_trip(model, type(reference), tmp_path / "out", ids, mask, reference)
    ours, theirs = _run(model, back, ids, mask, _global_tokens())
    assert_parity(ours.logits, theirs.logits, mask)


def test_lmforge_preset_exports_to_a_directory_the_reference_loads(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("longformer-base")).eval()  # n_global_tokens=1: <s>
    attach(model, "classification", n_labels=3)
    assert_reference_loads_export(model, transformers.AutoModelForSequenceClassification, tmp_path,
                                  *_batch(seed=8), per_token=False)


def test_export_refuses_default_global_tokens_the_architecture_does_not_have(tmp_path):
    from lmforge.convert import ConversionError
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("longformer-base"))  # <s> global, but the MLM has no default global
    attach(model, "lm")
    with pytest.raises(ConversionError):
        model.save(tmp_path, format="hf")


def test_odd_attention_window_is_refused_by_name(tmp_path):
    assert_load_refuses(_reference("LongformerModel", (4, 4)), tmp_path, CheckpointError, "attention_window",
                        attention_window=[4, 5])


@pytest.mark.parametrize("paths", [{"local_attention": "dense"}, {"local_attention": "blocked"},
                                   {"local_attention": "blocked", "chunk": 3, "unpad": "always"}])
def test_optimized_model_matches_at_uneven_lengths_and_padded_global_tokens(tmp_path, paths):
    """Optimized (fast/blocked.py's query chunks, or a dense mask) as the reference: lengths off the
    windows' multiples, a one-token row, and global tokens on padding, which the reference ignores."""
    from lmforge.fast.paths import FastPaths

    reference = _reference()
    model = lmforge.optimize(load_reference(reference, tmp_path), paths=FastPaths(**paths))
    ids, mask = _batch(seed=10, lengths=(17, 1, 9))
    glob = torch.zeros_like(ids)
    glob[0, [0, 15]] = 1
    glob[1, [0, 4, 16]] = 1  # row 1 has one token: 4 and 16 are padding
    glob[2, 12] = 1  # padding only
    ours, theirs = _run(model, reference, ids, mask, glob)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert_parity(ours.logits, theirs.logits, mask)


def test_optimized_model_matches_without_an_attention_mask(tmp_path):
    """Blocked chunks given global tokens per row and no padding mask (a batch of equal lengths): the
    plan takes its batch from the global tokens (it took it from the absent mask and failed)."""
    from lmforge.fast.paths import FastPaths

    reference = _reference()
    model = lmforge.optimize(load_reference(reference, tmp_path), paths=FastPaths(local_attention="blocked"))
    ids, _ = _batch(seed=11, lengths=(13, 13))
    glob = torch.zeros_like(ids)
    glob[0, [0, 9]] = 1
    glob[1, 4] = 1  # another token per row
    with torch.no_grad():
        theirs = reference(ids, global_attention_mask=glob)
        ours = model(ids, global_tokens=glob)
    assert_parity(ours.logits, theirs.logits)
