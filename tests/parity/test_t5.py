import pytest
import torch
import torch.nn.functional as F

import lmforge

from tests.parity.helpers import assert_parity, padded_batch, save_reference, transformers

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


def _shift_right(labels, start=0, pad=0):
    """T5's decoder inputs: labels shifted right behind the start token, -100 read as pad."""
    shifted = torch.cat([torch.full_like(labels[:, :1], start), labels[:, :-1]], dim=1)
    return shifted.masked_fill(shifted == -100, pad)


def _batch():
    ids, mask = padded_batch(99)
    target, target_mask = padded_batch(99, lengths=(5, 7, 2), seed=1)
    labels = target.masked_fill(target_mask == 0, -100)
    return ids, mask, labels, _shift_right(labels), target_mask


@pytest.mark.parametrize("version", [V10, V11])
def test_hidden_states_logits_and_loss_on_padded_batches(tmp_path, version):
    reference = _reference(version)
    model = lmforge.load(save_reference(reference, tmp_path))
    assert model.config.tied_logit_scale == (version == V10)
    assert model.config.tie_embeddings == (version == V10)
    ids, mask, labels, decoder_ids, decoder_mask = _batch()
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels, decoder_attention_mask=decoder_mask,
                           output_hidden_states=True)
        ours = model(ids, mask, decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask)
    assert_parity(ours.encoder_last_hidden_state, theirs.encoder_last_hidden_state, mask)
    assert_parity(ours.last_hidden_state, theirs.decoder_hidden_states[-1], decoder_mask)
    assert_parity(ours.logits, theirs.logits, decoder_mask)
    loss = F.cross_entropy(ours.logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def test_bare_model_and_encoder_model(tmp_path):
    reference = _reference(V11, "T5Model")
    model = lmforge.load(save_reference(reference, tmp_path / "bare"))
    ids, mask, _, decoder_ids, decoder_mask = _batch()
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, decoder_input_ids=decoder_ids,
                           decoder_attention_mask=decoder_mask)
        ours = model(ids, mask, decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask)
    assert not model.heads
    assert_parity(ours.last_hidden_state, theirs.last_hidden_state, decoder_mask)
    assert_parity(ours.encoder_last_hidden_state, theirs.encoder_last_hidden_state, mask)

    encoder_ref = _reference(V10, "T5EncoderModel")
    encoder = lmforge.load(save_reference(encoder_ref, tmp_path / "encoder"))
    assert encoder.config.architecture == "encoder"
    with torch.no_grad():
        assert_parity(encoder(ids, mask).last_hidden_state,
                      encoder_ref(ids, attention_mask=mask).last_hidden_state, mask)


@pytest.mark.parametrize("version", [V10, V11])
def test_export_round_trip_gives_the_same_state_dicts(tmp_path, version):
    reference = _reference(version)
    model = lmforge.load(save_reference(reference, tmp_path / "in"))
    model.save(tmp_path / "out", format="hf")
    again = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
    ours, theirs = again.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert again.config.scale_decoder_outputs == reference.config.scale_decoder_outputs
    back = lmforge.load(tmp_path / "out")
    assert back.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("architecture", ["encoder-decoder", "encoder"])
def test_lmforge_model_exports_to_a_directory_the_reference_loads(tmp_path, architecture):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("t5-small", architecture=architecture)).eval()
    ids, mask, _, decoder_ids, decoder_mask = _batch()
    if architecture == "encoder":
        model.save(tmp_path, format="hf")
        reference = transformers.T5EncoderModel.from_pretrained(tmp_path).eval()
        with torch.no_grad():
            assert_parity(model(ids, mask).last_hidden_state,
                          reference(ids, attention_mask=mask).last_hidden_state, mask)
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
    model = lmforge.load(save_reference(reference, tmp_path))
    ids, mask = padded_batch(99, seed=3)
    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
        ours = lmforge.generate(model, ids, attention_mask=mask, max_new_tokens=20)
        assert ours[:, 0].eq(0).all() and len(set(ours[0].tolist())) > 3  # start token, then variety
        assert torch.equal(ours, theirs)
        # a token row 0 emits at step 3 becomes eos: that row stops there and the rest is pad
        stop = int(theirs[0, 3])
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                                    eos_token_id=stop)
        ours = lmforge.generate(model, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=stop)
    assert ours[0, 4:].eq(0).all()
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("option, value", [("feed_forward_proj", "gated-relu"),
                                           ("feed_forward_proj", "gated-gelu-x")])
def test_unsupported_options_are_named(tmp_path, option, value):
    import json

    reference = _reference(V10, "T5Model")
    save_reference(reference, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**hf, option: value}))
    with pytest.raises(ValueError, match=option):
        lmforge.load(tmp_path)
