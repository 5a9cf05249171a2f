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
    ("train.jsonl", lambda p: read_task_file(p, "cls")), ("squad.json", read_squad),
    ("passages.jsonl", read_passages), ("questions.jsonl", read_questions), ("config.json", read_json_object)])
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
