import pytest
import torch

import lmforge

from tests.parity.helpers import (BEAM_VARIANTS, assert_bare_seq2seq_parity, assert_beam_parity,
                                  assert_export_state_dicts, assert_forward_parity, assert_load_refuses,
                                  assert_parity, assert_reference_loads_export, assert_seq2seq_greedy_parity,
                                  assert_seq2seq_parity, load_reference, padded_batch, shift_right,
                                  transformers)

V10, V11 = "v1.0", "v1.1"


def _reference(version=V10, architecture="T5ForConditionalGeneration", **kw):
    """Tiny T5: v1.0 (ReLU, tied and scaled head) or v1.1 (gated GELU, its own head, unscaled)."""
    torch.manual_seed(0)
    v11 = version == V11
    cfg = transformers.T5Config(**{
        **dict(vocab_size=99, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3, num_heads=4,
               relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0,
               pad_token_id=0, eos_token_id=1, feed_forward_proj="gated-gelu" if v11 else "relu",
               tie_word_embeddings=not v11), **kw})
    reference = getattr(transformers, architecture)(cfg)
    if v11 and hasattr(reference, "lm_head"):
        # the reference ties every fresh model; v1.1 checkpoints carry their own lm_head
        reference.lm_head.weight = torch.nn.Parameter(torch.randn(99, 32))
    return reference.eval()


def _batch():
    """ids, mask, labels, decoder inputs (labels shifted right behind the start token, also pad) and
    the decoder mask."""
    ids, mask = padded_batch(99)
    target, target_mask = padded_batch(99, lengths=(5, 7, 2), seed=1)
    labels = target.masked_fill(target_mask == 0, -100)
    return ids, mask, labels, shift_right(labels, 0, 0), target_mask


@pytest.mark.parametrize("version", [V10, V11])
def test_hidden_states_logits_and_loss_on_padded_batches(tmp_path, version):
    reference = _reference(version)
    model = load_reference(reference, tmp_path)
    assert model.config.tied_logit_scale == (version == V10)
    assert model.config.tie_embeddings == (version == V10)
    assert_seq2seq_parity(model, reference, *_batch())


def test_bare_model_and_encoder_model(tmp_path):
    reference = _reference(V11, "T5Model")
    model = load_reference(reference, tmp_path / "bare")
    ids, mask, _, decoder_ids, decoder_mask = _batch()
    assert_bare_seq2seq_parity(model, reference, ids, mask, decoder_ids, decoder_mask)

    encoder_ref = _reference(V10, "T5EncoderModel")
    encoder = load_reference(encoder_ref, tmp_path / "encoder")
    assert encoder.config.architecture == "encoder"
    assert_forward_parity(encoder, encoder_ref, ids, mask, "last_hidden_state")


@pytest.mark.parametrize("version", [V10, V11])
def test_export_round_trip_gives_the_same_state_dicts(tmp_path, version):
    reference = _reference(version)
    again = assert_export_state_dicts(load_reference(reference, tmp_path / "in"), reference, tmp_path / "out")
    assert again.config.scale_decoder_outputs == reference.config.scale_decoder_outputs


@pytest.mark.parametrize("architecture", ["encoder-decoder", "encoder"])
def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path, architecture):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("t5-small", architecture=architecture)).eval()
    ids, mask, _, decoder_ids, _ = _batch()
    if architecture == "encoder":
        assert_reference_loads_export(model, transformers.T5EncoderModel, tmp_path, ids, mask,
                                      output="last_hidden_state")
        return
    attach(model, "lm")
    model.save(tmp_path, format="hf")
    reference = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert_parity(model(ids, mask, decoder_input_ids=decoder_ids).logits,
                      reference(ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits)


def _lively(reference):
    """Larger projection weights: a fresh model would repeat one token, which checks too little."""
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if p.dim() == 2 and "shared" not in name and "relative" not in name:
                p.normal_(0, 0.5)
    return reference


@pytest.mark.parametrize("version", [V10, V11])
def test_greedy_generation_matches_reference(tmp_path, version):
    # the reference's generate sizes its cache by the encoder depth: equal depths here
    reference = _lively(_reference(version, num_decoder_layers=2))
    model = load_reference(reference, tmp_path)
    ours = assert_seq2seq_greedy_parity(model, reference, *padded_batch(99, seed=3), pad=0)
    assert ours[:, 0].eq(0).all() and len(set(ours[0].tolist())) > 3  # start token, then variety


@pytest.mark.parametrize("options", BEAM_VARIANTS)
def test_beam_search_matches_reference(tmp_path, options):
    reference = _lively(_reference(V11, num_decoder_layers=2))
    model = load_reference(reference, tmp_path)
    ours = assert_beam_parity(model, reference, *padded_batch(99, seed=3), **options)
    assert ours[:, 0].eq(0).all()


def test_beam_hypotheses_that_end_early_are_filled_as_the_reference_fills_them(tmp_path):
    reference = _lively(_reference(V11, num_decoder_layers=2))
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, seed=3)
    options = dict(num_beams=4, num_return_sequences=4, max_new_tokens=12, eos_token_id=18)
    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=mask, do_sample=False, **options)
    ours = lmforge.generate(model, ids, mask, **options)
    assert torch.equal(ours, theirs)
    stops = (ours[:, 1:] == 18).long()
    after = (stops.cumsum(1) - stops) > 0  # positions after a hypothesis ended
    assert after.any() and ours[:, 1:][after].eq(18).all()  # filled with eos: T5's pad id 0 is falsy there


@pytest.mark.parametrize("option, value", [("feed_forward_proj", "gated-relu"),
                                           ("feed_forward_proj", "gated-gelu-x")])
def test_unsupported_options_are_named(tmp_path, option, value):
    assert_load_refuses(_reference(V10, "T5Model"), tmp_path, ValueError, option, **{option: value})


@pytest.mark.parametrize("version", [V10, V11])
def test_a_stored_stack_table_that_differs_from_shared_is_refused(tmp_path, version):
    from safetensors.torch import load_file, save_file

    from lmforge.io import CheckpointError

    reference = _reference(version)
    reference.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    # the reference loader then keeps the encoder's own table; lmforge has one
    tensors["encoder.embed_tokens.weight"] = torch.randn_like(tensors["shared.weight"])
    save_file(tensors, str(tmp_path / "model.safetensors"), {"format": "pt"})
    with pytest.raises(CheckpointError, match="encoder.embed_tokens.weight differs from shared"):
        lmforge.load(tmp_path)


def test_stored_stack_tables_equal_to_shared_load(tmp_path):
    from safetensors.torch import load_file, save_file

    reference = _reference()
    reference.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))  # as .bin checkpoints hold them
    for stack in ("encoder", "decoder"):
        tensors[f"{stack}.embed_tokens.weight"] = tensors["shared.weight"].clone()
    save_file(tensors, str(tmp_path / "model.safetensors"), {"format": "pt"})
    ids, mask = padded_batch(99)
    decoder_ids = shift_right(ids[:, :5], 0, 0)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        assert_parity(lmforge.load(tmp_path)(ids, mask, decoder_input_ids=decoder_ids).logits, theirs)


def test_a_checkpoint_s_own_lm_head_is_scaled_as_its_config_says(tmp_path):
    """scale_decoder_outputs=True with a stored lm_head that differs from shared: the reference unties
    it and still scales the decoder's output; lmforge loads it untied with tied_logit_scale, as scaled."""
    reference = _reference(V10)
    reference.lm_head.weight = torch.nn.Parameter(torch.randn(99, 32))
    model = load_reference(reference, tmp_path)
    assert not model.config.tie_embeddings and model.config.tied_logit_scale
    assert_seq2seq_parity(model, reference, *_batch())
