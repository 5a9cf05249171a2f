"""Reference activation names: one lmforge lacks is refused naming the config field that holds it."""
import pytest

from lmforge.config import ConfigError
from lmforge.convert.hf import hf_model_config

SIZES = {"bert": dict(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=64),
         "gpt2": dict(vocab_size=99, n_embd=32, n_layer=1, n_head=4, n_positions=64),
         "distilbert": dict(vocab_size=99, dim=32, n_layers=1, n_heads=4, hidden_dim=64),
         "xlnet": dict(vocab_size=99, d_model=32, n_layer=1, n_head=4, d_inner=64),
         "bart": dict(vocab_size=99, d_model=32, encoder_layers=1, decoder_layers=1,
                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                      decoder_ffn_dim=64, max_position_embeddings=64)}


@pytest.mark.parametrize("model_type, field", [("bert", "hidden_act"), ("gpt2", "activation_function"),
                                               ("distilbert", "activation"), ("xlnet", "ff_activation"),
                                               ("bart", "activation_function")])
def test_an_unknown_activation_is_refused_naming_its_field(model_type, field):
    """The refusal said "activation 'silu' is not supported", naming no field of config.json."""
    with pytest.raises(ConfigError, match=f"^{field}='silu' is not supported") as refused:
        hf_model_config({"model_type": model_type, **SIZES[model_type], field: "silu"})
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("model_type, field", [("bart", "tie_word_embeddings"), ("t5", "tie_word_embeddings"),
                                               ("gpt2", "scale_attn_weights"), ("t5", "is_encoder_decoder")])
def test_a_true_false_field_holding_text_is_refused_naming_it(model_type, field):
    """The string "false" was read as true (tested `is not False`): a BART or T5 loaded tied,
    a GPT-2 scaled."""
    sizes = {**SIZES, "t5": dict(vocab_size=99, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)}
    base = {"model_type": model_type, **sizes[model_type]}
    hf_model_config({**base, field: None})  # null reads as the reference's default
    with pytest.raises(ConfigError, match=f"^{field} must be true or false, got 'false'"):
        hf_model_config({**base, field: "false"})
