import json

import pytest
import torch
import torch.nn.functional as F

import lmforge

from tests.parity.helpers import assert_parity, padded_batch, save_reference, transformers

PAD, BOS, EOS = 1, 0, 2


def _reference(architecture="BartForConditionalGeneration", **kw):
    """Tiny BART; the forced final eos is off, since lmforge.generate does not force tokens."""
    torch.manual_seed(0)
    cfg = transformers.BartConfig(**{
        **dict(vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
               forced_eos_token_id=None), **kw})
    reference = getattr(transformers, architecture)(cfg)
    if hasattr(reference, "final_logits_bias"):  # zero at init; make the mapping visible
        reference.final_logits_bias.normal_(generator=torch.Generator().manual_seed(1))
    return reference.eval()


def _shift_right(labels, start=EOS, pad=PAD):
    """BART's decoder inputs: labels shifted right behind decoder_start_token_id, -100 read as pad."""
    shifted = torch.cat([torch.full_like(labels[:, :1], start), labels[:, :-1]], dim=1)
    return shifted.masked_fill(shifted == -100, pad)


def _sentences(seed=0):
    """Right-padded rows that end in their eos, with no other eos: what the tokenizer makes."""
    ids, mask = padded_batch(99, seed=seed)
    ids = ids.masked_fill(ids == EOS, 3).masked_fill(mask == 0, PAD)
    last = mask.sum(1) - 1
    ids[torch.arange(ids.shape[0]), last] = EOS
    return ids, mask


@pytest.mark.parametrize("scale_embedding", [False, True])
def test_hidden_states_logits_and_loss_on_padded_batches(tmp_path, scale_embedding):
    reference = _reference(scale_embedding=scale_embedding)
    model = lmforge.load(save_reference(reference, tmp_path))
    ids, mask = padded_batch(99)
    target, decoder_mask = padded_batch(99, lengths=(5, 7, 2), seed=1)
    labels = target.masked_fill(decoder_mask == 0, -100)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels, decoder_attention_mask=decoder_mask,
                           output_hidden_states=True)
        ours = model(ids, mask, decoder_input_ids=_shift_right(labels), decoder_attention_mask=decoder_mask)
    assert_parity(ours.encoder_last_hidden_state, theirs.encoder_last_hidden_state, mask)
    assert_parity(ours.last_hidden_state, theirs.decoder_hidden_states[-1], decoder_mask)
    assert_parity(ours.logits, theirs.logits, decoder_mask)
    loss = F.cross_entropy(ours.logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def test_bare_model(tmp_path):
    reference = _reference("BartModel")
    model = lmforge.load(save_reference(reference, tmp_path))
    ids, mask = _sentences()
    decoder_ids = _shift_right(ids)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, decoder_input_ids=decoder_ids,
                           decoder_attention_mask=mask)
        ours = model(ids, mask, decoder_input_ids=decoder_ids, decoder_attention_mask=mask)
    assert not model.heads
    assert_parity(ours.last_hidden_state, theirs.last_hidden_state, mask)
    assert_parity(ours.encoder_last_hidden_state, theirs.encoder_last_hidden_state, mask)


def test_sequence_classification_pools_the_final_eos(tmp_path):
    reference = _reference("BartForSequenceClassification", num_labels=3)
    model = lmforge.load(save_reference(reference, tmp_path))
    ids, mask = _sentences(seed=2)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask).logits  # decoder inputs: ids shifted right
        ours = model(ids, mask, decoder_input_ids=_shift_right(ids), decoder_attention_mask=mask).logits
    assert ours.shape == (3, 3)
    assert_parity(ours, theirs)


def test_question_answering(tmp_path):
    reference = _reference("BartForQuestionAnswering")
    model = lmforge.load(save_reference(reference, tmp_path))
    ids, mask = _sentences(seed=3)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask)
        ours = model(ids, mask, decoder_input_ids=_shift_right(ids), decoder_attention_mask=mask).logits
    assert_parity(ours[..., 0], theirs.start_logits, mask)
    assert_parity(ours[..., 1], theirs.end_logits, mask)


@pytest.mark.parametrize("architecture", ["BartForConditionalGeneration", "BartForSequenceClassification"])
def test_export_round_trip_gives_the_same_state_dicts(tmp_path, architecture):
    reference = _reference(architecture)
    model = lmforge.load(save_reference(reference, tmp_path / "in"))
    model.save(tmp_path / "out", format="hf")
    again = getattr(transformers, architecture).from_pretrained(tmp_path / "out").eval()
    ours, theirs = again.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    back = lmforge.load(tmp_path / "out")
    assert back.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())


def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("bart-base", scale_embeddings=True)).eval()
    attach(model, "lm")
    model.save(tmp_path, format="hf")
    reference = transformers.BartForConditionalGeneration.from_pretrained(tmp_path).eval()
    ids, mask = _sentences(seed=4)
    with torch.no_grad():
        assert_parity(model(ids, mask, decoder_input_ids=_shift_right(ids)).logits,
                      reference(ids, attention_mask=mask, decoder_input_ids=_shift_right(ids)).logits)


def test_greedy_generation_matches_reference(tmp_path):
    reference = _reference()
    model = lmforge.load(save_reference(reference, tmp_path))
    ids, mask = _sentences(seed=5)
    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
    ours = lmforge.generate(model, ids, attention_mask=mask, max_new_tokens=20)
    assert ours[:, 0].eq(EOS).all()  # decoder_start_token_id
    assert torch.equal(ours, theirs)


def test_greedy_generation_with_its_own_lm_head_and_an_early_eos(tmp_path):
    # a fresh tied model mostly repeats the token it reads; its own head makes the text vary
    reference = _reference()
    own = torch.randn(99, 32, generator=torch.Generator().manual_seed(2))
    reference.lm_head.weight = torch.nn.Parameter(own)
    model = lmforge.load(save_reference(reference, tmp_path))
    assert not model.config.tie_embeddings
    ids, mask = _sentences(seed=5)
    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
        ours = lmforge.generate(model, ids, attention_mask=mask, max_new_tokens=20)
        assert len(set(ours[0].tolist())) > 5
        assert torch.equal(ours, theirs)
        stop = int(theirs[0, 3])  # a token row 0 emits at step 3 becomes eos: the row stops there
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                                    eos_token_id=stop)
        ours = lmforge.generate(model, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=stop)
    assert ours[0, 4:].eq(PAD).all()
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("option, value", [("decoder_attention_heads", 2), ("decoder_ffn_dim", 32),
                                           ("normalize_before", True), ("activation_function", "tanh")])
def test_unsupported_options_are_named(tmp_path, option, value):
    save_reference(_reference("BartModel"), tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**hf, option: value}))
    with pytest.raises(ValueError, match=option if option != "activation_function" else "tanh"):
        lmforge.load(tmp_path)
