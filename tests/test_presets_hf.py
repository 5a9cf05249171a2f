"""Every preset against the reference library's model of the same checkpoint, both on the meta device:
the same parameter count (less BERT's pooler, a head in lmforge) and the same architecture field by field
(the Hugging Face config, written with the released checkpoint's values, read by lmforge's converter).
Unlike tests/parity/test_parameter_counts.py, the reference configs are not derived from the presets."""
import pytest
import torch

import lmforge
from lmforge.convert.hf import hf_model_config
from lmforge.heads import make_head
from lmforge.model import from_config

transformers = pytest.importorskip("transformers")


def _bert(d: int, layers: int, heads: int, **more) -> dict:
    return dict(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * d,
                **more)


def _electra(embed: int, d: int, layers: int, heads: int, d_ff: int) -> dict:
    return dict(embedding_size=embed, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=d_ff)


def _albert(d: int, layers: int, heads: int) -> dict:
    return dict(vocab_size=30000, embedding_size=128, hidden_size=d, num_hidden_layers=layers,
                num_attention_heads=heads, intermediate_size=4 * d, hidden_act="gelu_new",
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


ROBERTA = dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
               layer_norm_eps=1e-5)
T5 = dict(vocab_size=32128, d_kv=64, feed_forward_proj="relu", tie_word_embeddings=True)
LLAMA_32_ROPE = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position_embeddings=8192)
# preset -> (transformers class prefix, the released checkpoint's config values)
REFERENCE = {
    "bert-tiny": ("Bert", _bert(128, 2, 2)), "bert-mini": ("Bert", _bert(256, 4, 4)),
    "bert-small": ("Bert", _bert(512, 4, 8)), "bert-medium": ("Bert", _bert(512, 8, 8)),
    "bert-base": ("Bert", _bert(768, 12, 12)), "bert-large": ("Bert", _bert(1024, 24, 16)),
    "roberta-base": ("Roberta", _bert(768, 12, 12, **ROBERTA)),
    "roberta-large": ("Roberta", _bert(1024, 24, 16, **ROBERTA)),
    "distilbert-base": ("DistilBert", dict(dim=768, n_layers=6, n_heads=12, hidden_dim=3072)),
    "albert-base": ("Albert", _albert(768, 12, 12)), "albert-large": ("Albert", _albert(1024, 24, 16)),
    "albert-xlarge": ("Albert", _albert(2048, 24, 16)), "albert-xxlarge": ("Albert", _albert(4096, 12, 64)),
    "electra-small": ("Electra", _electra(128, 256, 12, 4, 1024)),
    "electra-base": ("Electra", _electra(768, 768, 12, 12, 3072)),
    "electra-large": ("Electra", _electra(1024, 1024, 24, 16, 4096)),
    "electra-small-generator": ("Electra", _electra(128, 256, 12, 4, 1024)),
    "electra-base-generator": ("Electra", _electra(768, 256, 12, 4, 1024)),
    "electra-large-generator": ("Electra", _electra(1024, 256, 24, 4, 1024)),
    "spanbert-base": ("Bert", _bert(768, 12, 12, vocab_size=28996)),
    "xlnet-base": ("XLNet", dict(vocab_size=32000, d_model=768, n_layer=12, n_head=12, d_inner=3072)),
    "xlnet-large": ("XLNet", dict(vocab_size=32000, d_model=1024, n_layer=24, n_head=16, d_inner=4096)),
    "openai-gpt": ("OpenAIGPT", dict(vocab_size=40478, n_positions=512, n_embd=768, n_layer=12, n_head=12)),
    "gpt2": ("GPT2", dict(n_embd=768, n_layer=12, n_head=12)),
    "gpt2-medium": ("GPT2", dict(n_embd=1024, n_layer=24, n_head=16)),
    "gpt2-large": ("GPT2", dict(n_embd=1280, n_layer=36, n_head=20)),
    "gpt2-xl": ("GPT2", dict(n_embd=1600, n_layer=48, n_head=25)),
    "t5-small": ("T5", dict(T5, d_model=512, d_ff=2048, num_layers=6, num_heads=8)),
    "t5-base": ("T5", dict(T5, d_model=768, d_ff=3072, num_layers=12, num_heads=12)),
    "t5-large": ("T5", dict(T5, d_model=1024, d_ff=4096, num_layers=24, num_heads=16)),
    # the released facebook/bart-* config.json files set attention_dropout 0.1 (BartConfig's default is 0.0)
    "bart-base": ("Bart", dict(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                               decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                               attention_dropout=0.1)),
    "bart-large": ("Bart", dict(d_model=1024, encoder_layers=12, decoder_layers=12, encoder_ffn_dim=4096,
                                decoder_ffn_dim=4096, attention_dropout=0.1)),
    "longformer-base": ("Longformer", _bert(768, 12, 12, **{**ROBERTA, "max_position_embeddings": 4098},
                                            attention_window=512)),
    "bigbird-base": ("BigBird", dict(vocab_size=50358, max_position_embeddings=4096, hidden_act="gelu_new",
                                     block_size=64, num_random_blocks=3)),
    "llama-3.2-1b": ("Llama", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                   num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                                   head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
                                   tie_word_embeddings=True, rope_theta=500000.0,
                                   rope_scaling=LLAMA_32_ROPE)),
    "mistral-7b": ("Mistral", dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                   max_position_embeddings=32768, rms_norm_eps=1e-5, sliding_window=4096,
                                   rope_theta=10000.0, tie_word_embeddings=False)),
    "bloom-560m": ("Bloom", dict(vocab_size=250880, hidden_size=1024, n_layer=24, n_head=16)),
}
# where the preset follows the paper and the converter the reference library's inference defaults
CHOSEN = {"longformer-base": {"n_global_tokens"},  # the paper's [CLS] global; HF: none unless given
          "bigbird-base": {"random_block_choice", "dense_max_len"}}  # HF eval: the first blocks, dense < 704
# the checkpoints' counts with their LM heads (transformers' *ForCausalLM): Llama 3.2 1B, Mistral 7B v0.1
WITH_LM_HEAD = {"llama-3.2-1b": 1_235_814_400, "mistral-7b": 7_241_732_096}


def _reference(name: str):
    prefix, values = REFERENCE[name]
    config = getattr(transformers, prefix + "Config")(**values)
    with torch.device("meta"):
        model = getattr(transformers, prefix + "Model")(config)
    return config, model


def test_every_preset_with_a_reference_is_compared():
    assert set(lmforge.presets.PRESETS) - set(REFERENCE) == {"transformer-base", "transformer-big",
                                                        "linformer-base"}  # the reference has no Linformer


@pytest.mark.parametrize("name", list(REFERENCE))
def test_the_preset_has_the_reference_checkpoint_s_parameters(name):
    config, reference = _reference(name)
    with torch.device("meta"):
        ours = from_config(lmforge.get_config(name), init=False)
    pooler = sum(p.numel() for key, p in reference.named_parameters() if key.startswith("pooler."))
    assert ours.num_parameters() == sum(p.numel() for p in reference.parameters()) - pooler
    if name in WITH_LM_HEAD:  # an untied head is the LM's own: 131M more in Mistral
        with torch.device("meta"):
            head = sum(p.numel() for p in make_head(ours, "lm").parameters())
        assert ours.num_parameters() + head == WITH_LM_HEAD[name]


@pytest.mark.parametrize("name", list(REFERENCE))
def test_the_preset_is_the_reference_checkpoint_s_architecture(name):
    """Activation, eps, norm placement, positions, vocabulary, tying, RoPE, GQA, windows, dropout ...:
    every field that a parameter count cannot see."""
    config, _ = _reference(name)
    _, read = hf_model_config({**config.to_dict(), "model_type": config.model_type})
    preset, reference = lmforge.get_config(name).canonical().to_dict(), read.canonical().to_dict()
    differ = {key for key in preset if preset[key] != reference[key]}
    assert differ == CHOSEN.get(name, set()), {key: (preset[key], reference[key]) for key in differ}
