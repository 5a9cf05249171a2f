"""utils/yamltext: a user's YAML is read with exponent-form numbers as numbers, never crashing the reader."""
import re

import pytest
import yaml

from lmforge.utils.yamltext import load_yaml


def test_exponent_forms_are_numbers_and_other_text_stays_text():
    text = "lr: 1e-3\nbudget: 6.0e13\nd: 3.2E1\nneg: -5e-2\nname: e5\nversion: 1.2.3\nplain: 0.5\nn: 7\n"
    assert load_yaml(text) == {"lr": 1e-3, "budget": 6.0e13, "d": 32.0, "neg": -5e-2, "name": "e5",
                               "version": "1.2.3", "plain": 0.5, "n": 7}
    assert yaml.safe_load("lr: 1e-3") == {"lr": "1e-3"}  # what plain PyYAML would have given


def test_nesting_too_deep_is_a_yaml_error_not_a_recursion_error():
    with pytest.raises(yaml.YAMLError, match="nested too deeply"):
        load_yaml("[" * 20000)


def test_a_config_file_s_exponent_numbers_reach_the_model_fields(tmp_path):
    from lmforge.cli.common import read_config_file, resolve_config

    (tmp_path / "c.yaml").write_text("d_model: 3.2e1\nn_heads: 4\n")
    overrides = read_config_file(str(tmp_path / "c.yaml"))
    assert resolve_config("bert-base", overrides).d_model == 32  # as d_model=3.2e1 on the command line


def test_a_key_given_twice_is_refused_in_yaml_and_json_but_a_merge_key_overrides():
    for text in ('{"steps": 1, "steps": 2}', "lr: 1\nsteps: 3\nlr: 2\n"):
        with pytest.raises(yaml.YAMLError, match="given twice"):
            load_yaml(text)
    assert load_yaml("base: &b {lr: 1, steps: 2}\nrun:\n  <<: *b\n  lr: 3\n")["run"] == {"lr": 3, "steps": 2}


def test_a_key_given_twice_is_one_line_naming_the_key_and_its_lines():
    """PyYAML's marks ('in "<unicode string>", line 3, column 1:', the line, a caret) spanned lines."""
    for text, lines in (("lr: 1\nsteps: 3\nlr: 2\n", "lines 1 and 3"), ('{"lr": 1, "lr": 2}', "line 1")):
        with pytest.raises(yaml.YAMLError) as err:
            load_yaml(text)
        assert str(err.value) == f"key 'lr' given twice ({lines})"


def test_aliases_standing_for_too_many_values_or_for_themselves_are_refused():
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"] + \
        [f"{n}: &{n} [{', '.join(['*' + p] * 10)}]" for p, n in zip("abcdefgh", "bcdefghi")]
    with pytest.raises(yaml.YAMLError, match="more than"):
        load_yaml("\n".join(levels))  # 10**9 values, from 9 lines
    with pytest.raises(yaml.YAMLError, match="holds itself"):
        load_yaml("a: &a [1, *a]")
    assert load_yaml("a: &a [1, 2]\nb: *a\n") == {"a": [1, 2], "b": [1, 2]}  # a bounded alias is fine


@pytest.mark.parametrize("text, said", [("d_model: 2024-13-01", "month must be in 1..12"),
                                        ("d_model: " + "9" * 5000, "Exceeds the limit (4300 digits)")])
def test_a_scalar_its_constructor_cannot_build_is_a_yaml_error(tmp_path, capsys, text, said):
    """A date that is no date or an int of 5000 digits was a bare ValueError: lmforge inspect d_model=... said
    'month must be in 1..12', naming no field, and --config named no file (and advised
    sys.set_int_max_str_digits). A key=value now reaches the field's check as text; a file is named."""
    from lmforge.cli import main

    with pytest.raises(yaml.YAMLError, match=re.escape(said)):
        load_yaml(text)
    (tmp_path / "c.yaml").write_text(text + "\n")
    assert main(["inspect", "bert-base", "--config", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"cannot read config file {tmp_path / 'c.yaml'}" in err and "set_int_max_str_digits" not in err
    assert main(["inspect", "bert-base", text.replace(": ", "=")]) == 2
    assert "d_model must be an integer, got '" in capsys.readouterr().err
