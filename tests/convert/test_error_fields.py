"""Every ConfigError names the field it refuses in `.field`, so a Python caller can tell which is wrong."""
import ast
import json
from pathlib import Path

import pytest

import lmforge
from lmforge.config import ConfigError
from lmforge.convert import FAMILIES, load_hf

PACKAGE = Path(lmforge.__file__).parent

BERT = dict(model_type="bert", vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64)


def _unnamed_config_errors(root: Path) -> list:
    """(path, line text) of each `ConfigError(...)` call under `root` given no field."""
    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) == "ConfigError"):
                continue
            if len(node.args) < 2 and not any(k.arg == "field" for k in node.keywords):
                found.append((path.relative_to(root).as_posix(), lines[node.lineno - 1].strip()))
    return found


def test_every_config_error_is_given_a_field():
    """A ConfigError raised with a message alone left `.field` None (convert/ raised ~60 such)."""
    assert _unnamed_config_errors(PACKAGE) == []


def test_the_scan_finds_an_unnamed_call(tmp_path):
    """The walk sees a call without a field and accepts one with a second argument or field=."""
    source = 'ConfigError("a")\nConfigError("b", "f")\nchecks.ConfigError("c", field="g")\n'
    (tmp_path / "x.py").write_text(source)
    assert _unnamed_config_errors(tmp_path) == [("x.py", 'ConfigError("a")')]


def _refusal(tmp_path, hf: dict) -> ConfigError:
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ConfigError) as refused:
        load_hf(tmp_path)
    return refused.value


@pytest.mark.parametrize("hf, field", [
    (dict(BERT, model_type="albert", embedding_size=32), "embedding_size"),
    (dict(BERT, model_type="big_bird", attention_type="sliding"), "attention_type"),
    (dict(BERT, model_type="big_bird", use_bias=False), "use_bias"),
    (dict(BERT, position_embedding_type="relative_key"), "position_embedding_type"),
    (dict(BERT, model_type="longformer", onnx_export=True), "onnx_export"),
])
def test_an_unsupported_reference_option_is_refused_naming_its_key(tmp_path, hf, field):
    """Loading a config.json lmforge cannot express names the config.json key in `.field`."""
    err = _refusal(tmp_path, hf)
    assert err.field == field
    assert field in str(err)


def test_a_missing_reference_key_is_named(tmp_path):
    """A config.json lacking a size the family needs names that key, not the KeyError's quoted repr."""
    err = _refusal(tmp_path, {k: v for k, v in BERT.items() if k != "hidden_size"})
    assert err.field == "hidden_size"


def test_an_unsupported_model_type_and_architecture_are_named(tmp_path):
    """The two keys load_hf dispatches on name themselves."""
    assert _refusal(tmp_path, dict(BERT, model_type="gpt9")).field == "model_type"
    assert _refusal(tmp_path, dict(BERT, architectures=["BertForNothing"])).field == "architectures"


def test_an_export_refusal_names_the_lmforge_field_and_a_head_kind_is_named():
    """to_reference refuses a ModelConfig field; head_rules refuses a head kind with field "kind"."""
    cfg = lmforge.tiny("bert-base", n_segments=0)
    with pytest.raises(ConfigError) as refused:
        FAMILIES["bert"].to_reference(cfg)
    assert refused.value.field == "n_segments"
    with pytest.raises(ConfigError, match="has no T5 checkpoint layout") as refused:
        FAMILIES["t5"].head_rules("cls", "classification", lmforge.tiny("t5-small"))
    assert refused.value.field == "kind"
