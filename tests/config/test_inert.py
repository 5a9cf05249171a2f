"""Fields of no effect under a config (ModelConfig.inert_fields): an explicit override of one is refused by
name (build, get_config), a config read whole (a file, from_dict) keeps them, canonical() resets them."""
from __future__ import annotations

import pytest
from torch.nn.functional import relu

import lmforge
from lmforge.config import ConfigError, ModelConfig
from lmforge.heads import LMHead
from lmforge.objectives.rtd import generator_config
from lmforge.presets import ELMO_PRESETS, PRESETS, get_config, tiny, tiny_overrides


@pytest.mark.parametrize("preset, overrides, field, said", [
    ("bert-mini", dict(lstm_dim=64, char_filters=[[1, 8]]), "lstm_dim", "it is ELMo's (architecture='elmo')"),
    ("gpt2", dict(stateful=True), "stateful", "it is ELMo's"),
    ("bert-mini", dict(window=64), "window", "no layer's attention is windowed (attention='sliding-window'"),
    ("mistral-7b", dict(window_schedule=[64] * 32, window=128), "window", "window_schedule sets each"),
    ("mistral-7b", dict(dilation=2), "dilation", "no layer's attention is dilated (attention='dilated')"),
    ("bert-mini", dict(rotary_theta=5.0), "rotary_theta", "positions are not rotary (position='rotary')"),
    ("llama-3.2-1b", dict(rotary_scaling="none", rotary_scaling_factor=8.0), "rotary_scaling_factor",
     "no rotary scaling"),
    ("gpt2", dict(relative_buckets=8), "relative_buckets", "(position='relative-bias')"),
    ("bert-mini", dict(block_size=16), "block_size", "no layer's attention is bigbird (attention='bigbird')"),
    ("gpt2", dict(lm_activation="relu"), "lm_activation", "(lm_transform=True)"),
    ("elmo-small", dict(n_heads=2), "n_heads", "it is the Transformer's (architecture='encoder'"),
    ("elmo-small", dict(window=8), "window", "it is the Transformer's"),
    ("elmo-small", dict(tie_embeddings=True), "tie_embeddings", "its softmax has no token table to tie to"),
    ("elmo-small", dict(tied_logit_scale=True), "tied_logit_scale", "ELMo's softmax has no logit scale"),
])
def test_an_override_of_no_effect_is_refused_naming_the_field_and_what_gives_it_one(preset, overrides,
                                                                                     field, said):
    with pytest.raises(ConfigError) as err:
        lmforge.build(preset, **overrides)  # was a model on which they silently did nothing
    message = str(err.value)
    assert err.value.field == field and "\n" not in message
    assert message.startswith(f"{field}=") and "has no effect on this" in message and said in message


def test_the_same_fields_are_taken_where_the_config_gives_them_an_effect():
    assert get_config("bert-mini", attention="sliding-window", window=64).window == 64
    assert get_config("bert-base", architecture="elmo", lstm_dim=64, d_model=100).lstm_dim == 64  # 12 heads
    assert get_config("elmo-small", lstm_dim=64, char_filters=[[1, 8]]).lstm_dim == 64
    assert get_config("llama-3.2-1b", rotary_theta=1e4).rotary_theta == 1e4
    assert get_config("bert-mini", lm_activation="relu").lm_activation == "relu"


def test_lm_activation_on_a_tied_encoder_without_transform_is_taken_for_electra_s_generator_head():
    assert get_config("xlnet-base", lm_activation="relu").lm_activation == "relu"  # was refused
    generator = lmforge.build(generator_config(tiny("xlnet-base", lm_activation="relu")))  # rtd's
    assert LMHead(generator).act is relu  # its head has a transform, of this activation
    assert "lm_activation" in get_config("gpt2").inert_fields()  # a decoder trains no such generator


def test_an_override_at_the_field_s_default_and_fields_outside_the_architecture_are_taken():
    cfg = get_config("bert-mini", window=512, rotary_theta=10000, eos_token_id=3, source="mine")
    assert (cfg.window, cfg.eos_token_id, cfg.source) == (512, 3, "mine")
    assert get_config("electra-small", generator_size=0.5).generator_size == 0.5


def test_build_from_a_config_refuses_its_overrides_of_no_effect_but_not_the_config_s_own():
    own = ModelConfig.from_dict({**tiny("bert-base").to_dict(), "lstm_dim": 64, "window": 32})  # a file's
    assert own.lstm_dim == 64 and lmforge.build(own).config.lstm_dim == 64
    with pytest.raises(ConfigError, match=r"^n_highway=3 has no effect on this 'encoder' model") as err:
        lmforge.build(own, n_highway=3)
    assert err.value.field == "n_highway"


def test_a_config_file_with_fields_of_no_effect_still_loads(tmp_path):
    ModelConfig(stateful=True, rotary_theta=5.0).save(tmp_path / "config.json")  # as a converter's may be
    assert ModelConfig.load(tmp_path / "config.json").stateful is True


def test_canonical_resets_elmo_s_fields_on_a_transformer_and_keeps_an_elmo_s_transformer_fields():
    assert ModelConfig(lstm_dim=64, char_filters=[[1, 8]]).canonical() == ModelConfig().canonical()
    elmo = get_config("elmo-small")
    assert elmo.canonical().n_heads == 1 and elmo.canonical().lstm_dim == 1024  # n_heads=12 divides no 128
    assert elmo.canonical().attention_dropout == 0.0  # as the identity of earlier ELMo runs recorded it
    assert "n_heads" in elmo.inert_fields() and "lstm_dim" not in elmo.inert_fields()


def test_inert_fields_names_only_fields_and_says_what_gives_each_an_effect():
    names = {f for f in ModelConfig.__dataclass_fields__}
    for name in (*PRESETS, *ELMO_PRESETS):
        inert = get_config(name).inert_fields()
        assert set(inert) <= names and all(isinstance(why, str) and why for why in inert.values()), name
    assert "window" not in get_config("mistral-7b").inert_fields()
    assert "window" in get_config("bert-base").inert_fields()


@pytest.mark.parametrize("name", [*PRESETS, *ELMO_PRESETS])
def test_every_preset_builds_with_its_tiny_sizes_as_overrides(name):
    sizes = tiny_overrides(get_config(name))
    cfg = get_config(name, **sizes)  # tests' override path (objectives/test_registry.py): none refused
    assert not set(sizes) & set(cfg.inert_fields()) and cfg.d_model == tiny(name).d_model == 32


@pytest.mark.parametrize("data, overrides, field", [([1], {}, "config"), ({}, [("window", 8)], "overrides")])
def test_from_overrides_refuses_what_is_not_a_mapping_naming_it(data, overrides, field):
    """from_overrides spread both with **: a list was a bare TypeError where from_dict says ConfigError."""
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_overrides(data, overrides)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: must be a mapping of model config fields, got list")


def test_an_elmo_s_tie_embeddings_is_of_no_effect_and_kept_as_runs_recorded_it():
    """ELMo's presets untie (False), ModelConfig's default ties: False is taken as the value of no effect
    (True refused, above), and canonical() keeps either, so no ELMo run's recorded identity changes."""
    assert get_config("elmo-small", tie_embeddings=False).tie_embeddings is False
    assert "tie_embeddings" in get_config("elmo-small").inert_fields()
    assert "tie_embeddings" not in get_config("bert-base").inert_fields()
    assert get_config("elmo-small").canonical().tie_embeddings is False  # reset to True, runs' would differ
    assert get_config("bert-base", architecture="elmo").canonical().tie_embeddings is True


def test_tied_logit_scale_is_of_no_effect_on_an_elmo_alone_and_kept_as_runs_recorded_it():
    """The reference scales by scale_decoder_outputs whether or not its lm_head is the table, so an untied
    T5 takes the field; an ELMo's softmax has no scale (False taken), and canonical() keeps its T5 value."""
    assert get_config("t5-small", tie_embeddings=False, tied_logit_scale=True).tied_logit_scale is True
    assert "tied_logit_scale" not in get_config("t5-small", tie_embeddings=False).inert_fields()
    assert get_config("elmo-small", tied_logit_scale=False).tied_logit_scale is False
    assert "tied_logit_scale" in get_config("elmo-small").inert_fields()
    assert get_config("t5-small", architecture="elmo").canonical().tied_logit_scale is True
