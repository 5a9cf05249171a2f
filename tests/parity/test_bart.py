import json

import pytest
import torch

import lmforge

from tests.parity.helpers import (BEAM_VARIANTS, assert_bare_seq2seq_parity, assert_beam_parity,
                                  assert_export_state_dicts, assert_load_refuses,
                                  assert_parity, assert_seq2seq_greedy_parity, assert_seq2seq_parity,
                                  assert_span_logits_parity, load_reference, padded_batch, shift_right,
                                  transformers)

PAD, BOS, EOS = 1, 0, 2


def _reference(architecture="BartForConditionalGeneration", **kw):
    """Tiny BART; the forced final eos (BartConfig's default: 2) is off unless `kw` turns it on."""
    torch.manual_seed(0)
    cfg = transformers.BartConfig(**{
        **dict(vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
               forced_eos_token_id=None), **kw})
    reference = getattr(transformers, architecture)(cfg)
    if hasattr(reference, "final_logits_bias"):  # zero at init; make the mapping visible
        reference.final_logits_bias.normal_(generator=torch.Generator().manual_seed(1))
    return reference.eval()


def _shift_right(labels):
    """BART's decoder inputs: labels shifted right behind decoder_start_token_id (eos)."""
    return shift_right(labels, EOS, PAD)


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
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99)
    target, decoder_mask = padded_batch(99, lengths=(5, 7, 2), seed=1)
    labels = target.masked_fill(decoder_mask == 0, -100)
    assert_seq2seq_parity(model, reference, ids, mask, labels, _shift_right(labels), decoder_mask)


def test_bare_model(tmp_path):
    reference = _reference("BartModel")
    model = load_reference(reference, tmp_path)
    ids, mask = _sentences()
    assert_bare_seq2seq_parity(model, reference, ids, mask, _shift_right(ids), mask)


def test_sequence_classification_pools_the_final_eos(tmp_path):
    reference = _reference("BartForSequenceClassification", num_labels=3)
    model = load_reference(reference, tmp_path)
    ids, mask = _sentences(seed=2)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask).logits  # decoder inputs: ids shifted right
        ours = model(ids, mask, decoder_input_ids=_shift_right(ids), decoder_attention_mask=mask).logits
    assert ours.shape == (3, 3)
    assert_parity(ours, theirs)


def test_question_answering(tmp_path):
    reference = _reference("BartForQuestionAnswering")
    model = load_reference(reference, tmp_path)
    ids, mask = _sentences(seed=3)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask)
        ours = model(ids, mask, decoder_input_ids=_shift_right(ids), decoder_attention_mask=mask).logits
    assert_span_logits_parity(ours, theirs, mask)


@pytest.mark.parametrize("architecture", ["BartForConditionalGeneration", "BartForSequenceClassification"])
def test_export_round_trip_gives_the_same_state_dicts(tmp_path, architecture):
    reference = _reference(architecture)
    assert_export_state_dicts(load_reference(reference, tmp_path / "in"), reference, tmp_path / "out")


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
    model = load_reference(reference, tmp_path)
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
    model = load_reference(reference, tmp_path)
    assert not model.config.tie_embeddings
    free = assert_seq2seq_greedy_parity(model, reference, *_sentences(seed=5), pad=PAD)
    assert len(set(free[0].tolist())) > 5


def _own_head(reference):
    """Its own LM head: a fresh tied model mostly repeats the token it reads, which checks too little."""
    own = torch.randn(99, 32, generator=torch.Generator().manual_seed(2))
    reference.lm_head.weight = torch.nn.Parameter(own)
    return reference


@pytest.mark.parametrize("options", BEAM_VARIANTS)
def test_beam_search_with_the_forced_final_eos(tmp_path, options):
    reference = _own_head(_reference(forced_eos_token_id=EOS))
    model = load_reference(reference, tmp_path)
    assert model.config.forced_eos_token_id == EOS
    ours = assert_beam_parity(model, reference, *_sentences(seed=5), **options)
    assert ours[:, 0].eq(EOS).all()


def test_forced_eos_is_read_applied_and_exported(tmp_path):
    reference = _own_head(_reference(forced_eos_token_id=EOS))
    model = load_reference(reference, tmp_path / "in")
    assert model.config.forced_eos_token_id == EOS
    ids, mask = _sentences(seed=5)
    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    ours = lmforge.generate(model, ids, attention_mask=mask, max_new_tokens=6)
    assert torch.equal(ours, theirs) and ours[:, -1].eq(EOS).all()
    # generation_config.json, where present, decides alone: without the field nothing is forced
    generation = json.loads((tmp_path / "in" / "generation_config.json").read_text())
    del generation["forced_eos_token_id"]
    (tmp_path / "in" / "generation_config.json").write_text(json.dumps(generation))
    again = transformers.BartForConditionalGeneration.from_pretrained(tmp_path / "in")
    assert lmforge.load(tmp_path / "in").config.forced_eos_token_id is None
    assert again.generation_config.forced_eos_token_id is None
    for forced in (EOS, None):  # an unset forced eos is exported as null, not left to BART's default
        model.config = model.config.replace(forced_eos_token_id=forced)
        model.save(tmp_path / str(forced), format="hf")
        back = transformers.BartForConditionalGeneration.from_pretrained(tmp_path / str(forced))
        assert back.generation_config.forced_eos_token_id == forced
        assert lmforge.load(tmp_path / str(forced)).config == model.config


@pytest.mark.parametrize("option, value", [("decoder_attention_heads", 2), ("decoder_ffn_dim", 32),
                                           ("normalize_before", True), ("activation_function", "tanh")])
def test_unsupported_options_are_named(tmp_path, option, value):
    match = option if option != "activation_function" else "tanh"
    assert_load_refuses(_reference("BartModel"), tmp_path, ValueError, match, **{option: value})


def _untied(share_stacks: bool):
    """tie_word_embeddings=false: the reference then reads each stack's own token table."""
    reference = _reference(tie_word_embeddings=False)
    if share_stacks:  # as older checkpoints hold them: the stacks' tables are `shared`
        with torch.no_grad():
            for stack in (reference.model.encoder, reference.model.decoder):
                stack.embed_tokens.weight.copy_(reference.model.shared.weight)
    return reference


def test_untied_stack_tables_that_differ_from_shared_are_refused(tmp_path):
    assert_load_refuses(_untied(share_stacks=False), tmp_path, ValueError, "embed_tokens.weight differs")


def test_a_tied_checkpoint_with_its_own_stack_table_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    _reference().save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))  # tied, yet the reference reads the stored table
    tensors["model.decoder.embed_tokens.weight"] = torch.randn_like(tensors["model.shared.weight"])
    save_file(tensors, str(tmp_path / "model.safetensors"), {"format": "pt"})
    with pytest.raises(ValueError, match="decoder.embed_tokens.weight differs from shared"):
        lmforge.load(tmp_path)


def test_untied_model_loads_and_exports_its_stack_tables(tmp_path):
    reference = _untied(share_stacks=True)
    model = load_reference(reference, tmp_path / "in")
    assert not model.config.tie_embeddings
    ids, mask = _sentences()
    target, decoder_mask = padded_batch(99, lengths=(5, 7, 2), seed=1)
    labels = target.masked_fill(decoder_mask == 0, -100)
    assert_seq2seq_parity(model, reference, ids, mask, labels, _shift_right(labels), decoder_mask)
    back = assert_export_state_dicts(model, reference, tmp_path / "out")  # the stacks' tables written too
    assert torch.equal(back.model.decoder.embed_tokens.weight, reference.model.shared.weight)
