"""Recorded attention probabilities equal the reference library's eager attentions (fp32, 1e-6):
self-attention of encoders and decoders, GQA, sliding windows, T5's relative bias, and the
self- and cross-attention of encoder-decoders."""
import pytest
import torch

from tests.parity.helpers import load_reference, padded_batch, transformers

B_LENGTHS = (9, 6, 3)


def _bert():
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64))


def _gpt2():
    # special ids inside the tiny vocabulary (GPT-2's own 50256 is refused on load: outside [0, 99))
    return transformers.GPT2Model(transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4,
                                                          n_positions=64, bos_token_id=0, eos_token_id=0))


def _llama():
    return transformers.LlamaModel(transformers.LlamaConfig(
        vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64))


def _mistral():
    return transformers.MistralModel(transformers.MistralConfig(
        vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, sliding_window=4))


def _t5():
    return transformers.T5Model(transformers.T5Config(
        vocab_size=99, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0,
        pad_token_id=0))


def _bart():
    return transformers.BartModel(transformers.BartConfig(
        vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64))


def _eager(build):
    torch.manual_seed(0)
    reference = build().eval()
    reference.set_attn_implementation("eager")
    return reference


def _assert_rows_equal(ours, theirs, mask):
    """Per layer (B, H, Tq, Tk), at real query rows; 1e-6 absolute."""
    assert len(ours) == len(theirs)
    rows = mask.bool()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.permute(0, 2, 1, 3)[rows], b.permute(0, 2, 1, 3)[rows],
                                   atol=1e-6, rtol=0)


@pytest.mark.parametrize("build", [_bert, _gpt2, _llama, _mistral], ids=["bert", "gpt2", "llama", "mistral"])
def test_self_attention_probabilities_equal_the_references_eager_ones(tmp_path, build):
    reference = _eager(build)
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, B_LENGTHS)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, output_attentions=True).attentions
        ours = model(ids, attention_mask=mask, return_attention=True).attentions
    _assert_rows_equal(ours, theirs, mask)


@pytest.mark.parametrize("build", [_t5, _bart], ids=["t5", "bart"])
def test_encoder_decoder_and_cross_attention_equal_the_references(tmp_path, build):
    reference = _eager(build)
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, B_LENGTHS, pad=reference.config.pad_token_id)
    target = torch.randint(3, 99, (3, 5), generator=torch.Generator().manual_seed(2))
    full = torch.ones_like(target)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, decoder_input_ids=target, output_attentions=True)
        ours = model(ids, attention_mask=mask, decoder_input_ids=target, return_attention=True)
        encoded = model.encode(ids, mask, return_attention=True)
    _assert_rows_equal(encoded.attentions, theirs.encoder_attentions, mask)
    _assert_rows_equal(ours.attentions, theirs.decoder_attentions, full)
    _assert_rows_equal(ours.cross_attentions, theirs.cross_attentions, full)
