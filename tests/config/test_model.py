"""ModelConfig read from a mapping or a file: every refusal is a ConfigError with a field, and a file's names
the file (one that cannot be read, is not JSON, or holds no mapping: its field is the file)."""
from __future__ import annotations

import pytest

from lmforge.config import ConfigError, ModelConfig


@pytest.mark.parametrize("data", [[1, 2], 3, None, "n_layers"])
def test_a_config_that_is_no_mapping_is_a_config_error_naming_the_whole_config(data):
    with pytest.raises(ConfigError, match="a model config must be a mapping of fields") as err:
        ModelConfig.from_dict(data)
    assert err.value.field == "config"


@pytest.mark.parametrize("text, said", [("[1, 2]", "must be a mapping of fields, got list"),
                                        ("7", "must be a mapping of fields, got int"),
                                        ("{bad", "cannot read a model config"),
                                        (b"\xff", "cannot read a model config")],
                         ids=["list", "number", "not-json", "not-utf8"])
def test_a_config_file_that_holds_no_config_mapping_is_a_config_error_naming_the_file(tmp_path, text, said):
    file = tmp_path / "config.json"
    file.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=said) as err:
        ModelConfig.load(file)
    assert str(err.value).startswith(f"{file}: ") and err.value.field == str(file)


@pytest.mark.parametrize("make", [lambda p: None, lambda p: p.mkdir()], ids=["missing", "a-folder"])
def test_a_config_file_that_cannot_be_read_is_a_config_error_naming_it(tmp_path, make):
    file = tmp_path / "config.json"
    make(file)
    with pytest.raises(ConfigError, match="cannot read a model config") as err:
        ModelConfig.load(file)
    assert err.value.field == str(file)


def test_a_bad_field_of_a_config_file_names_the_file_and_keeps_the_field(tmp_path):
    file = tmp_path / "config.json"
    file.write_text('{"n_layers": "x"}')
    with pytest.raises(ConfigError, match="n_layers must be an integer") as err:
        ModelConfig.load(file)
    assert str(err.value).startswith(f"{file}: ") and err.value.field == "n_layers"


def test_a_saved_config_loads_as_it_was(tmp_path):
    cfg = ModelConfig()
    cfg.save(tmp_path / "config.json")
    assert ModelConfig.load(tmp_path / "config.json") == cfg
