import dataclasses
import json

import pytest

from lmforge.config import ConfigError, ModelConfig


@pytest.mark.parametrize("fields, message", [
    (dict(d_model=100, n_heads=12), "d_model=100 is not divisible by n_heads=12"),
    (dict(n_heads=12, n_kv_heads=5), "n_heads=12 is not divisible by n_kv_heads=5"),
    (dict(position="rotary", d_model=96, n_heads=4, rotary_dim=7), "rotary_dim=7 must be even"),
    (dict(position="rotary", rotary_dim=128), "exceeds the head width"),
    (dict(position="wavelet"), "position='wavelet' is not one of learned, sinusoidal"),
    (dict(norm="batchnorm"), "norm='batchnorm' is not one of layernorm, rmsnorm"),
    (dict(ffn="tanh"), "ffn='tanh' is not one of"),
    (dict(architecture="rnn"), "architecture='rnn' is not one of encoder, decoder, encoder-decoder"),
    (dict(attention="sliding-window", window=1024, max_seq_len=512),
     "window=1024 is larger than max_seq_len=512"),
    (dict(attention="longformer", architecture="decoder"), "needs bidirectional attention"),
    (dict(attention_schedule=["full", "sliding-window"]), "attention_schedule has 2 entries but n_layers=12"),
    (dict(n_layers=2, attention_schedule=["full", "sparse"]), "entry 'sparse' is not one of"),
    (dict(d_model=0), "d_model must be an integer >= 1"),
    (dict(dropout=1.5), "dropout must be a finite number >= 0 and < 1, got 1.5"),
    (dict(n_decoder_layers=3), "n_decoder_layers is only valid for architecture='encoder-decoder'"),
    (dict(attention="linformer", linformer_k=1024), "linformer_k=1024 exceeds max_seq_len=512"),
    (dict(attention="linformer", position="alibi"), "attention='linformer' cannot use position='alibi'"),
    (dict(global_projections=True), "global_projections=True needs attention='longformer'"),
    (dict(attention="bigbird", block_size=256), "block_size=256 needs max_seq_len >= 3 blocks"),
    (dict(pooler_activation="softmax"), "pooler_activation='softmax' is not one of tanh, relu, gelu"),
    (dict(lm_activation="swiglu"), "lm_activation='swiglu' is not one of relu, gelu, gelu-tanh"),
    (dict(position="rotary", rotary_scaling="yarn"), "rotary_scaling='yarn' is not one of none, linear"),
    (dict(position="rotary", rotary_scaling="llama3", rotary_low_freq_factor=4.0),
     "must satisfy 0 < low < high"),
    (dict(n_layers=4, attention_schedule="full"), "attention_schedule must be a list"),
    (dict(n_layers=2, attention_schedule=["full", 3]), "attention_schedule must be a list of pattern names"),
    (dict(n_layers=2, attention_schedule=["full", "sliding-window"], share_layers=True),
     "share_layers=True needs one attention pattern"),
    (dict(generator_size=1.5), "generator_size must be a finite number > 0 and <= 1, got 1.5"),
    (dict(rotary_scaling="yarn"), "rotary_scaling='yarn' is not one of"),  # refused beside any position
    (dict(pruned_heads={"encoder.0": [0]}, n_kv_heads=4), "pruned_heads needs separate layers"),
    (dict(ffn_sizes={"encoder.0": 10}, share_layers=True), "ffn_sizes needs separate layers"),
    (dict(quantization={"mode": "fp4"}), "quantization mode 'fp4' is not"),
    (dict(position="xl-relative", architecture="decoder"), "position='xl-relative' (XLNet) is only"),
])
def test_invalid_configs_name_the_field(fields, message):
    with pytest.raises(ConfigError) as err:
        ModelConfig(**fields)
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    # `.field` is the field the message names: the server's 422 and a form point at it
    assert err.value.field in {f.name for f in dataclasses.fields(ModelConfig)}
    assert err.value.field in str(err.value)


def test_unknown_field_is_named():
    with pytest.raises(ConfigError, match="unknown config field hidden_size"):
        ModelConfig.from_dict({"hidden_size": 768})


def test_json_round_trip(tmp_path):
    cfg = ModelConfig(architecture="decoder", position="rotary", norm="rmsnorm", n_kv_heads=4,
                      attention_schedule=["sliding-window", "full"] * 6, window=128)
    cfg.save(tmp_path / "c.json")
    assert ModelConfig.load(tmp_path / "c.json") == cfg
    assert json.loads((tmp_path / "c.json").read_text())["n_kv_heads"] == 4


def test_derived_sizes():
    cfg = ModelConfig(d_model=512, n_heads=8, n_kv_heads=2, d_embed=128, norm_placement="pre")
    assert (cfg.head_dim, cfg.kv_heads, cfg.embed_dim, cfg.has_final_norm) == (64, 2, 128, True)
    assert ModelConfig(n_heads=8, d_head=96).head_dim == 96


def test_replace_validates():
    with pytest.raises(ConfigError, match="n_kv_heads"):
        ModelConfig().replace(n_kv_heads=5)


def test_canonical_ignores_fields_without_effect():
    a = ModelConfig(window=8, block_size=4, relative_buckets=8, source="x")
    assert a != ModelConfig() and a.canonical() == ModelConfig().canonical()
    assert ModelConfig(attention="sliding-window", window=8).canonical() != ModelConfig(
        attention="sliding-window", window=16).canonical()


def test_canonical_drops_an_lm_activation_equal_to_the_ffn_one():
    assert ModelConfig(lm_activation="gelu").canonical() == ModelConfig().canonical()
    assert ModelConfig(ffn="geglu", lm_activation="gelu").canonical() == ModelConfig(ffn="geglu").canonical()
    assert ModelConfig(lm_transform=False, lm_activation="relu").canonical() == ModelConfig(
        lm_transform=False).canonical()
    assert ModelConfig(ffn="relu", lm_activation="gelu").canonical() != ModelConfig(ffn="relu").canonical()


def test_canonical_ignores_rotary_scaling_parameters_without_effect():
    rotary = ModelConfig(position="rotary")
    assert rotary.replace(rotary_scaling_factor=8.0).canonical() == rotary.canonical()
    linear = rotary.replace(rotary_scaling="linear", rotary_scaling_factor=2.0)
    assert linear.replace(rotary_original_max_len=64).canonical() == linear.canonical()
    assert linear.canonical() != rotary.canonical()


@pytest.mark.parametrize("fields, message", [
    (dict(n_layers=2, window_schedule=[4]), "window_schedule has 1 entries but n_layers=2"),
    (dict(n_layers=2, window_schedule=[4, 0]), "window_schedule entry 0 must be a positive integer"),
    (dict(attention="longformer", n_layers=2, window_schedule=[8, 1024]), "window=1024 is larger than"),
    (dict(random_block_choice="all"), "random_block_choice='all' is not one of seeded, first"),
    (dict(dense_max_len=-1), "dense_max_len must be an integer >= 0"),
])
def test_long_context_fields_are_validated(fields, message):
    with pytest.raises(ConfigError, match=message) as err:
        ModelConfig(**fields)
    assert err.value.field in str(err.value)


def test_equivalent_long_context_configs_are_canonically_equal():
    one = ModelConfig(attention="longformer", n_layers=2, window=8)
    assert ModelConfig(attention="longformer", n_layers=2, window_schedule=[8, 8]).canonical() == \
        one.canonical()
    assert ModelConfig(n_layers=2, window_schedule=[8, 4]).canonical() == ModelConfig(n_layers=2).canonical()
    big = ModelConfig(attention="bigbird", dense_max_len=10_000)
    assert big.canonical() == big.replace(dense_max_len=512).canonical()


def test_a_hundred_million_layers_are_refused_without_a_list_per_layer():
    import tracemalloc

    tracemalloc.start()
    with pytest.raises(ConfigError, match="n_layers must be an integer >= 1 and <= 1024"):
        ModelConfig(n_layers=100_000_000)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1_000_000  # a list per layer: 800 MB


def test_every_field_has_a_line_of_help():
    from dataclasses import fields

    assert all(f.metadata.get("help") for f in fields(ModelConfig))


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_saved_files_follow_the_umask(tmp_path, mask):
    import os
    import stat

    import lmforge
    from lmforge.utils.atomic import umask

    before = os.umask(mask)
    try:
        assert umask() == mask
        lmforge.build("bert-tiny", n_layers=1).save(tmp_path / "m")
    finally:
        os.umask(before)
    for name in ("model.safetensors", "config.json"):  # written to a mkstemp file (0600), then renamed
        assert stat.S_IMODE((tmp_path / "m" / name).stat().st_mode) == 0o666 & ~mask


def test_a_layer_key_of_no_layer_is_named_with_the_keys_there_are():
    cfg = ModelConfig(architecture="encoder-decoder", vocab_size=99, d_model=32, n_heads=4, d_ff=64,
                      n_layers=2, n_decoder_layers=1)
    with pytest.raises(ConfigError) as err:
        cfg.replace(pruned_heads={"encoder.5": [1]})
    assert str(err.value) == ("pruned_heads key 'encoder.5' names no layer of this encoder-decoder model "
                              "(keys are encoder.0 to encoder.1 or decoder.0 or cross.0): n_layers=2 leaves "
                              "no layer 5 (per-layer fields follow their layers)")
    with pytest.raises(ConfigError, match="'cross.1' .* n_decoder_layers=1 leaves no layer 1"):
        cfg.replace(pruned_heads={"cross.1": [1]})
    with pytest.raises(ConfigError, match=r"\(keys are encoder.0 to encoder.1 or decoder.0\)$"):
        cfg.replace(ffn_sizes={"cross.0": 8})  # no FFN of that name: no layer count to blame


def test_a_rewritten_file_keeps_its_own_mode(tmp_path):
    import os
    import stat

    import lmforge

    lmforge.build("bert-tiny", n_layers=1).save(tmp_path / "m")
    for name in ("model.safetensors", "config.json"):
        os.chmod(tmp_path / "m" / name, 0o600)  # the owner made them private
    lmforge.build("bert-tiny", n_layers=1).save(tmp_path / "m")
    for name in ("model.safetensors", "config.json"):
        assert stat.S_IMODE((tmp_path / "m" / name).stat().st_mode) == 0o600


@pytest.mark.parametrize("fields, field", [
    (dict(tie_embeddings="false"), "tie_embeddings"),  # a string is not a bool: it loaded as true
    (dict(norm_eps=0.0), "norm_eps"),  # every output would be NaN
    (dict(vocab_size=10**12), "vocab_size"),
    (dict(dropout=float("nan")), "dropout"),
    (dict(pruned_heads="x"), "pruned_heads"),
    (dict(vocab_size=100, eos_token_id=100), "eos_token_id"),  # a special id outside the vocabulary
    (dict(d_model=True), "d_model"),  # a bool is not a size
])
def test_every_field_is_typed_and_bounded_both_ways(fields, field):
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_dict(fields)
    assert err.value.field == field and str(err.value).startswith(field) and "\n" not in str(err.value)


def test_a_model_too_big_for_the_machine_is_refused_before_allocation(monkeypatch):
    import lmforge

    monkeypatch.setenv("LMFORGE_MEMORY_LIMIT", str(2**30))
    with pytest.raises(ConfigError, match=r"^n_layers=48: the model's parameters need .* GiB") as err:
        lmforge.build("gpt2", n_layers=48, d_model=1600, n_heads=25, d_ff=6400)
    assert err.value.field == "n_layers"


def test_json_whole_numbers_are_integers():
    assert ModelConfig.from_dict({"d_model": 768.0}).d_model == 768
    with pytest.raises(ConfigError, match="d_model must be a whole number"):
        ModelConfig.from_dict({"d_model": 768.5})


def test_huge_integers_tuples_and_bools_in_containers_are_judged_not_crashed():
    with pytest.raises(ConfigError, match="^vocab_size must be an integer"):
        ModelConfig.from_dict({"vocab_size": 10**400})  # past float's range: no OverflowError
    with pytest.raises(ConfigError, match=r"^dropout must be a finite number >= 0 and < 1, got 1.0$"):
        ModelConfig(dropout=1.0)
    with pytest.raises(ConfigError, match="pruned_heads"):
        ModelConfig(pruned_heads={"encoder.0": [True]})  # a bool is no head index
    assert ModelConfig(pruned_heads={"encoder.0": (1, 3)}).pruned_heads == {"encoder.0": [1, 3]}


def test_a_union_field_admits_each_of_its_types_and_nothing_else():
    """The shared check reads Union annotations too (EmbedOptions.truncate, FeatureOptions.layers)."""
    from lmforge.analysis.feature_options import FeatureOptions
    from lmforge.config.options import OptionsError

    for fine in ("all", -2, [0, 1]):
        assert FeatureOptions(layers=fine).layers == fine
    with pytest.raises(OptionsError, match="^layers must be an integer or a string or a list, got 2.5$"):
        FeatureOptions(layers=2.5)


def test_list_options_bound_their_count_and_every_item_by_one_declaration():
    """option(items=Items(...)) checks a list's length, each item's type and bounds, and repeats,
    in check_options."""
    from lmforge.config.options import OptionsError, help_rows
    from lmforge.retrieval.dpr import MAX_DIMS, EncoderOptions

    assert EncoderOptions(matryoshka_dims=[64, 32]).matryoshka_dims == (64, 32)
    refused = {(0,): r"^matryoshka_dims\[0\] must be an integer >= 1",
               (8, 8.5): r"^matryoshka_dims\[1\] must be an integer",
               (MAX_DIMS + 1,): rf"<= {MAX_DIMS}, got {MAX_DIMS + 1}$",
               tuple(range(1, 18)): "^matryoshka_dims must hold 0 to 16 integers, got 17$",
               (16, 16): "^matryoshka_dims must not repeat a value",
               (True,): r"^matryoshka_dims\[0\] must be an integer"}
    for dims, message in refused.items():
        with pytest.raises(OptionsError, match=message) as err:
            EncoderOptions(matryoshka_dims=dims)
        assert err.value.field == "matryoshka_dims"
    with pytest.raises(OptionsError, match=r"^matryoshka_weights\[0\] must be a finite number"):
        EncoderOptions(matryoshka_dims=(8,), matryoshka_weights=(float("inf"),))
    helps = {name: text for name, _, text in help_rows(EncoderOptions)}
    assert helps["matryoshka_dims"].endswith(f"(0 to 16, distinct, each in [1, {MAX_DIMS}])")


def test_a_list_option_must_bound_its_count():
    from lmforge.config.options import Items, option

    with pytest.raises(ValueError, match="max_items is required"):
        option((), "widths", items=Items("int"), low=1)


def test_refuse_changed_names_the_first_setting_off_its_default_and_passes_defaults():
    from dataclasses import dataclass, field

    from lmforge.config.options import OptionsError, option, refuse_changed

    @dataclass
    class Opts:
        a: int = option(1, "a")
        b: str = option("x", "b")
        c: list = field(default_factory=list)

    refuse_changed(Opts(), ("a", "b", "c"), "unread")  # defaults change nothing: they pass
    refuse_changed(Opts(a=2), ("b",), "unread")  # only the names asked about are judged
    with pytest.raises(OptionsError) as err:
        refuse_changed(Opts(b="y", c=[1]), ("a", "b", "c"), lambda name: f"{name} is not read here")
    assert err.value.field == "b" and str(err.value) == "b='y': b is not read here"
    with pytest.raises(OptionsError, match=r"^c=\[1\]: unread$"):  # a factory's default is its value
        refuse_changed(Opts(c=[1]), ("c",), "unread")


def test_numpy_numbers_build_options_as_python_s_numbers_of_the_same_value():
    """np.int64(3) was refused as 'not an integer' and np.float32(0.5) as 'not a number' (np.float64, a float
    subclass, passed); now each is read as the command line reads its text, and stored as Python's number."""
    np = pytest.importorskip("numpy")
    from lmforge.analysis.feature_options import FeatureOptions
    from lmforge.config.options import OptionsError
    from lmforge.generate.options import GenerationOptions

    given = GenerationOptions.build(None, {"max_new_tokens": np.int64(7), "top_p": np.float32(0.5),
                                           "eos_token_id": [np.int32(2), 3], "temperature": np.float32(2.0)})
    want = GenerationOptions(max_new_tokens=7, top_p=0.5, eos_token_id=[2, 3], temperature=2.0)
    assert given == want and type(given.max_new_tokens) is int and type(given.top_p) is float
    assert all(type(i) is int for i in given.eos_token_id)
    assert FeatureOptions.build(None, {"layers": [np.int64(0), np.int8(-1)]}).layers == [0, -1]
    for bad in ({"max_new_tokens": np.float32(2.5)}, {"max_new_tokens": np.int64(0)},
                {"do_sample": np.int64(1)}):
        with pytest.raises(OptionsError) as err:  # bounds, fractions and bools are judged as before
            GenerationOptions.build(None, bad)
        assert err.value.field == next(iter(bad))


def test_named_keywords_refuses_an_unknown_keyword_naming_it_and_keeps_the_signature():
    """An unknown keyword was Python's TypeError on the faces with explicit keywords (features, rerank,
    fill_mask, query_index) where embed and generate raised an OptionsError naming it."""
    import inspect

    import lmforge
    from lmforge.config.options import OptionsError, named_keywords
    from lmforge.retrieval.jobs import query_index

    @named_keywords("job")
    def job(a, b=1, *, c=2):
        """A job."""
        return a + b + c

    assert job(1, b=2, c=3) == 6 and str(inspect.signature(job)) == "(a, b=1, *, c=2)"
    assert job.__doc__ == "A job."
    with pytest.raises(OptionsError, match=r"^unknown job option d \(known: a, b, c\)$") as err:
        job(1, d=4)
    assert err.value.field == "d"
    faces = ((lmforge.embed, (["a"], "no-model")), (lmforge.features, (["a"], "no-model")),
             (lmforge.rerank, ("no-model", "q", ["d"])), (lmforge.fill_mask, ("no-model", None, "a [MASK]")),
             (query_index, ("no-index", ["q"])))
    for face, arguments in faces:  # refused before any model or index is looked for
        with pytest.raises(OptionsError, match=r"^unknown \w+ option bogus\b") as err:
            face(*arguments, bogus=1)
        assert err.value.field == "bogus"


def test_the_job_functions_arguments_read_numpy_numbers_as_their_options_do(tmp_path):
    """evaluate's batch_size and shard_corpus's workers / shard_bytes are checked by checked_argument, as
    embed's are: np.int64 is read as the int it is (it was refused as not an integer), a bad value still
    names the argument."""
    import numpy as np

    from lmforge.config.options import OptionsError
    from lmforge.data.shards import shard_corpus
    from lmforge.tasks.finetune import fine_tuned_task

    with pytest.raises(OptionsError, match="^batch_size must be an integer >= 1"):
        fine_tuned_task("no-such-model", [], "cls", batch_size=np.int64(0))
    with pytest.raises(OptionsError, match="^workers must be an integer >= 1"):
        shard_corpus([], None, tmp_path / "shards", workers=np.int64(0))
    with pytest.raises(ValueError, match="no-such-model") as err:  # past the checks: the model is looked for
        fine_tuned_task("no-such-model", [], "cls", batch_size=np.int64(8))
    assert not isinstance(err.value, OptionsError) or err.value.field != "batch_size"
    assert not (tmp_path / "shards").exists()


def test_a_function_argument_reads_a_whole_float_as_an_options_field_does():
    """checked_argument took np.int64 but refused 32.0 where coerce (a field's) and the server take it."""
    import numpy as np

    from lmforge.config.options import OptionsError, checked_argument

    meta = {"low": 1, "high": 64}
    read = [checked_argument("batch_size", "int", meta, v) for v in (32.0, np.float32(8.0), np.int64(3))]
    assert read == [32, 8, 3]
    assert all(type(checked_argument("batch_size", "int", meta, v)) is int for v in (32.0, np.int64(3)))
    for bad in (2.5, True, float("inf"), 128.0):
        with pytest.raises(OptionsError) as err:
            checked_argument("batch_size", "int", meta, bad)
        assert err.value.field == "batch_size"


def test_a_word_yaml_read_as_true_or_false_is_refused_saying_to_quote_it():
    """`schedule: no` in a YAML file arrives as False: the refusal says why, where a text is wanted."""
    from lmforge.config.options import OptionsError
    from lmforge.train import TrainConfig

    with pytest.raises(OptionsError, match=r"must be a string, got False \(a YAML file reads no, yes"):
        TrainConfig(schedule=False)
    with pytest.raises(OptionsError) as plain:
        TrainConfig(schedule=3)
    assert "YAML" not in str(plain.value)  # a number is no YAML word
