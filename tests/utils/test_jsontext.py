"""JSON nested deeper than Python's parser goes is a one-line ValueError naming the file in every reader
of a user's JSON (task files, SQuAD, passages, questions, a model's config.json), not a RecursionError."""
import json

import pytest

from lmforge.io.native import read_json_object
from lmforge.retrieval.passages import read_passages
from lmforge.retrieval.questions import read_questions
from lmforge.tasks.formats import read_task_file
from lmforge.tasks.qa import read_squad
from lmforge.utils.jsontext import loads

DEEP = '{"text": ' + "[" * 100_000 + "]" * 100_000 + ', "label": "a"}\n'


def test_loads_refuses_deep_nesting_as_a_decode_error_and_parses_the_rest():
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        loads(DEEP)
    assert loads('{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}


@pytest.mark.parametrize("name, read", [
    ("train.jsonl", lambda p: read_task_file(p, "cls")),
    ("squad.json", read_squad),
    ("passages.jsonl", read_passages),
    ("questions.jsonl", read_questions),
    ("config.json", read_json_object),
])
def test_every_reader_names_the_file_of_json_nested_too_deeply(tmp_path, name, read):
    path = tmp_path / name
    path.write_text(DEEP, encoding="utf-8")
    with pytest.raises(ValueError) as err:
        read(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_dumps_writes_strict_json_with_every_non_finite_number_as_null():
    from lmforge.utils.jsontext import dumps

    data = {"a": float("nan"), "b": [1.5, float("inf"), (-float("inf"), 2)], "c": {"d": "NaN", "e": 3}}
    text = dumps(data)
    assert json.loads(text, parse_constant=lambda word: pytest.fail(word)) == \
        {"a": None, "b": [1.5, None, [None, 2]], "c": {"d": "NaN", "e": 3}}


def test_a_key_given_twice_is_refused_naming_it_where_asked():
    """A task record {"label": "pos", "label": "neg"} had trained on its last label, unsaid."""
    assert loads('{"a": 1, "b": {"c": 2}}', unique_keys=True) == {"a": 1, "b": {"c": 2}}
    for text in ('{"label": "pos", "label": "neg"}', '{"x": [{"k": 1, "k": 2}]}'):
        with pytest.raises(json.JSONDecodeError, match="is given twice in one object"):
            loads(text, unique_keys=True)
    assert loads('{"a": 1, "a": 2}') == {"a": 2}  # json.loads' own reading where not asked (corpora, configs)


def test_a_task_record_or_squad_file_naming_a_key_twice_is_refused_naming_the_line(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"text": "good", "label": "pos"}\n{"text": "bad", "label": "pos", '
                                      '"label": "neg"}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:2: not valid JSON: the key 'label' is given twice"):
        read_task_file(tmp_path / "t.jsonl", "cls", {})
    (tmp_path / "s.json").write_text('{"data": [], "data": []}')
    with pytest.raises(ValueError, match="given twice"):
        read_squad(tmp_path / "s.json")


DEEP = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"  # past Python's JSON parser's recursion


def test_a_config_plan_or_weights_header_nested_past_the_parser_is_refused_naming_the_file(tmp_path):
    """A model config, a bake-off plan and a safetensors header raised a RecursionError (a traceback)."""
    from lmforge.bakeoff.plan import PlanError, load_plan
    from lmforge.config import ConfigError, ModelConfig
    from lmforge.io.files import safetensors_damage

    (tmp_path / "config.json").write_text(DEEP)
    with pytest.raises(ConfigError, match="config.json: cannot read a model config: nested too deeply"):
        ModelConfig.load(tmp_path / "config.json")
    (tmp_path / "plan.json").write_text(DEEP)
    with pytest.raises(PlanError, match="cannot read plan .*plan.json: nested too deeply"):
        load_plan(tmp_path / "plan.json")
    header = DEEP.encode()
    (tmp_path / "w.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    assert safetensors_damage(tmp_path / "w.safetensors") == \
        "not a safetensors file (its header is not valid)"
