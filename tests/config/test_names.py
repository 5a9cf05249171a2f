"""An unknown name (config field, option, keyword) is refused by one rule (lmforge.config.names) in one
short line: the name, the closest known names, and where the whole list is, never every known name."""
from __future__ import annotations

import dataclasses

import pytest

import lmforge
from lmforge.cli import main
from lmforge.config import ConfigError, ModelConfig, OptionsError
from lmforge.config.names import close_names, known_names, unknown_among, unknown_message
from lmforge.train import TrainConfig


def test_a_typo_of_a_model_field_from_python_suggests_the_field_in_one_short_line():
    with pytest.raises(ConfigError) as err:
        lmforge.build("bert-base", n_layer=2)
    message = str(err.value)
    assert message.startswith("unknown config field n_layer; did you mean n_layers")
    assert "lmforge options model" in message and len(message) < 200 and "\n" not in message
    assert "vocab_size" not in message  # the fields are not all listed
    assert err.value.field == "n_layer"


def test_a_name_close_to_nothing_is_named_with_where_the_list_is():
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_dict({**ModelConfig().to_dict(), "colour": "blue"})
    assert str(err.value) == "unknown config field colour (all: lmforge options model)"


def test_a_config_file_s_unknown_field_is_refused_alike(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"n_layer": 2}')
    with pytest.raises(ConfigError) as err:
        ModelConfig.load(path)
    named, message = str(err.value).split(": ", 1)  # the file, then the rule's line
    assert named == str(path) and message.startswith("unknown config field n_layer; did you mean n_layers")
    assert len(message) < 200


def test_an_options_object_s_typo_is_suggested_and_its_list_pointed_at():
    with pytest.raises(OptionsError) as err:
        TrainConfig.from_dict({"stpes": 3})
    assert str(err.value) == ("unknown training option stpes; did you mean steps? "
                              "(all: lmforge options pretrain)")


def test_several_unknown_names_are_counted_and_clipped_and_the_line_stays_short():
    known = [f"field_{i}" for i in range(100)]
    message = unknown_message(["x" * 500, "fieldd_1", "b", "c", "d"], known, listed="help(X)")
    assert message.startswith("unknown options b, c, d and 2 more; fieldd_1: did you mean field_1")
    assert len(message) < 200 and message.endswith("(all: help(X))")


def test_short_lists_are_given_in_the_line_and_close_names_are_closest_first():
    assert unknown_message(["d"], ["a", "b", "c"], "job option") == "unknown job option d (known: a, b, c)"
    assert close_names("n_layer", ["vocab_size", "n_layers", "n_decoder_layers"])[0] == "n_layers"


def test_the_command_line_refuses_the_typo_alike_with_exit_2(capsys):
    assert main(["inspect", "bert-tiny", "n_layer=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown config field n_layer; did you mean n_layers" in err and "lmforge options model" in err
    assert len(err) < 200 and "\n" not in err


def test_every_model_field_is_still_known():
    given = {f.name: getattr(ModelConfig(), f.name) for f in dataclasses.fields(ModelConfig)}
    assert ModelConfig.from_dict(given) == ModelConfig()


def test_the_reference_library_s_names_suggest_lmforge_s_own():
    """learning_rate is spelt nothing like lr, and hidden_size was read as ffn_sizes: both are suggested as
    what they mean, first."""
    with pytest.raises(ConfigError, match=r"^unknown config field hidden_size; did you mean d_model\b"):
        lmforge.build("bert-base", hidden_size=128)
    with pytest.raises(OptionsError, match=r"^unknown training option learning_rate; did you mean lr\?"):
        TrainConfig.from_dict({"learning_rate": 1e-4})
    assert close_names("num_layers", ["num_beams", "n_layers"])[0] == "n_layers"


def test_a_name_where_none_is_known_says_so():
    assert unknown_message(["x"], [], "clm option") == "unknown clm option x (known: none)"


def test_generation_s_max_length_suggests_max_new_tokens_not_the_opposite_bound():
    from lmforge.generate.options import GenerationOptions

    with pytest.raises(OptionsError) as err:
        GenerationOptions.build(None, {"max_length": 20})
    assert str(err.value).startswith("unknown generation option max_length; did you mean max_new_tokens")


def test_a_job_s_unknown_option_is_said_from_its_classes_and_listed_where_its_main_class_is():
    """One call derives the known names (the classes' fields, extra names, less those set elsewhere) and
    where they are listed, so no command writes "lmforge options KIND" or the field list by hand."""
    from lmforge.tasks.finetune import TaskConfig

    assert unknown_among(["stpes"], (TaskConfig, TrainConfig)) == (
        "unknown option stpes; did you mean steps? (all: lmforge options finetune)")
    assert unknown_among(["max_lenn"], (TrainConfig,), ["max_len"], "lmforge options distill").endswith(
        "did you mean max_len? (all: lmforge options distill)")
    assert "max_len" in known_names((TrainConfig,), ["max_len"])
    assert "seed" not in known_names((TaskConfig, TrainConfig), without={"seed"})
