"""Records given in Python are checked and made canonical as a task file's are (tasks/fields.py): the
same records, the same refusals, errors naming the list and the record's number."""
import json

import numpy as np
import pytest

from lmforge.config.options import OptionsError
from lmforge.tasks.fields import Records, given_records, predict_form, training_records
from lmforge.tasks.formats import read_task_file

QA_CONTEXT = "The cat sat on the mat."
GOOD = {
    "cls": [{"text": "good", "label": 1}, {"text": "bad", "label": 0}, {"text": "fine", "label": " pos "}],
    "pair": [{"text": "a", "text_pair": "b", "label": True}, {"text": "c", "text_pair": "d", "label": 2.5}],
    "regression": [{"text": "a", "label": 3}, {"text": "b", "text_pair": "c", "label": "0.5"}],
    "choice": [{"text": "a", "choices": ["x", "y"], "label": 1}],
    "seq2seq": [{"source": "a b", "target": "b a"}],
    "multilabel": [{"text": "a", "label": ["x", 1, " x "]}, {"text": "b", "text_pair": "c", "label": []}],
    "tagging": [{"words": ["The", "cat"], "tags": ["O", "B-ANIMAL"]}],
    "qa": [{"id": 7, "question": "Who sat?", "context": QA_CONTEXT,
            "answers": [{"text": "cat", "start": 4}]}],
}
BAD = {  # kind, record, what the error says after its location
    "label list": ("cls", {"text": "a", "label": [1]}, "label [1] is not a string, number or boolean"),
    "text object": ("pair", {"text": "a", "text_pair": {"b": 1}, "label": "x"},
                    "text_pair (column 'text_pair') must be text (a string or number), got"),
    "regression word": ("regression", {"text": "a", "label": "high"},
                        "regression label 'high' is not a number"),
    # float() reads these as 1.0 and 1000.0: a boolean or Python's digit groups are no target in a file
    "regression boolean": ("regression", {"text": "a", "label": True},
                           "regression label True is not a number"),
    "regression digit groups": ("regression", {"text": "a", "label": "1_000"},
                                "regression label '1_000' is not a number"),
    "choice outside": ("choice", {"text": "a", "choices": ["x"], "label": 3},
                       "choice label 3 is outside the 1"),
    "empty text": ("cls", {"text": " ", "label": "x"}, "empty text (column 'text')"),
    "multilabel text": ("multilabel", {"text": "a", "label": "x"},
                        'multilabel label "x" is not a list of labels'),
    "multilabel object": ("multilabel", {"text": "a", "label": [{}]},
                          "label[0]: label {} is not a string, number or boolean"),
    "tags unequal": ("tagging", {"words": ["a", "b"], "tags": ["O"]}, "2 words but 1 tags"),
    # a JSON "\ud800" (checked_text's rule): it was met in the tokenizer, naming neither record nor argument
    "lone surrogate": ("pair", {"text": "a", "text_pair": "b \ud800", "label": "x"},
                       "text_pair (column 'text_pair') is not valid Unicode: surrogates not allowed at "
                       "position 2"),
    "qa lone surrogate": ("qa", {"id": "q", "question": "who\udc80?", "context": "abc", "answers": []},
                          "question is not valid Unicode: surrogates not allowed at position 3"),
    "answer misplaced": ("qa", {"id": "q", "question": "?", "context": "abc",
                                "answers": [{"text": "c", "start": 0}]},
                         "answers[0] 'c' is not at character 0 of the context"),
}


def _as_file(tmp_path, records):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_python_records_become_what_the_same_records_read_from_a_file_become(tmp_path, kind):
    given = given_records(GOOD[kind], kind, "train")
    assert isinstance(given, Records) and given.source == "train"
    assert list(given) == list(read_task_file(_as_file(tmp_path, GOOD[kind]), kind))
    assert GOOD[kind][0].get("line") is None  # the caller's dicts are not written to


@pytest.mark.parametrize("case", sorted(BAD))
def test_python_records_are_refused_as_the_same_file_is_naming_the_list_and_record(tmp_path, case):
    kind, record, said = BAD[case]
    records = [GOOD[kind][0], record]
    with pytest.raises(OptionsError) as from_python:
        given_records(records, kind, "train")
    with pytest.raises(OptionsError) as from_file:
        read_task_file(_as_file(tmp_path, records), kind)
    assert str(from_python.value) == f"train:2: {said}" + str(from_file.value).split(said, 1)[1]
    assert str(from_file.value).startswith(f"{tmp_path / 'records.jsonl'}:2: {said}")
    # a typed error naming the argument the records came in; a file's names no argument, its message the file
    assert from_python.value.field == "train" and from_file.value.field is None


def test_class_ids_of_numpy_or_python_become_text_labels_and_two_spellings_are_refused():
    records = [{"text": "a", "label": np.int64(1)}, {"text": "b", "label": 0}]
    assert [r["label"] for r in given_records(records, "cls", "train")] == ["1", "0"]
    with pytest.raises(ValueError, match=r'^train:2: label "1" is also spelled 1 \(line 1\)'):
        given_records([{"text": "a", "label": 1}, {"text": "b", "label": "1"}], "cls", "train")


def test_what_is_no_record_list_is_refused_and_a_missing_field_names_no_columns_to_map():
    with pytest.raises(ValueError, match="^train: a list of records .dicts of fields. is needed, got str"):
        given_records("a text", "cls", "train")
    with pytest.raises(ValueError, match="^train:1: a record is a dict of fields, got 'a text'"):
        given_records(["a text"], "cls", "train")
    said = "^validation:1: no field 'text'; the record has 'sentence', 'label'$"
    with pytest.raises(ValueError, match=said):
        given_records([{"sentence": "a", "label": 1}], "cls", "validation")
    read = Records([{"text": "a"}], "f.jsonl")
    assert given_records(read, "cls", "train") is read  # read from a file: already canonical


@pytest.mark.parametrize("bad", [None, "a text", b"bytes", 3, {"text": "a", "label": "x"}])
def test_what_is_no_record_list_is_an_options_error_naming_train_or_validation(bad):
    """None or a str as train failed as a plain ValueError (a TypeError had been as near): the records are
    the caller's argument, refused as OptionsError naming it, as an empty train list already was."""
    with pytest.raises(OptionsError, match=f"^train: a list of records .dicts of fields. is needed, "
                                           f"got {type(bad).__name__}$") as caught:
        training_records("cls", bad)
    assert caught.value.field == "train"
    with pytest.raises(OptionsError, match="^validation: a list of records") as caught:
        given_records(bad, "cls", "validation")
    assert caught.value.field == "validation"
    with pytest.raises(OptionsError, match="^validation:1: a record is a dict of fields") as caught:
        given_records([None], "cls", "validation")
    assert caught.value.field == "validation"
    with pytest.raises(OptionsError, match="^train: no records") as caught:
        training_records("cls", [])
    assert caught.value.field == "train"


def test_records_of_a_kind_that_checks_its_own_are_listed_remembering_their_argument():
    """A reranker's records (checked as they are encoded) and those of no kind known are listed with their
    numbers as lines (a line a record says stays), as Records remembering the argument they came in, so that
    an encoding error names it, the split and the line."""
    rows = [{"query": "q", "positive": "p", "negatives": []}, {"line": 9, "query": "r"}]
    for kind in ("rerank", None):
        listed = given_records(iter(rows), kind, "validation")
        assert isinstance(listed, Records) and listed == [{"line": 1, **rows[0]}, rows[1]]
        assert listed.field == "validation" and listed.source == ""


def test_any_iterable_of_records_is_read_as_a_list_is():
    """A generator, or a Hugging Face datasets.Dataset (an iterable of dicts, no list), is read as a list."""
    records = GOOD["cls"]
    want = list(given_records(records, "cls", "train"))
    assert list(given_records((r for r in records), "cls", "train")) == want

    class Rows:  # as datasets.Dataset: indexable and iterable, no list
        def __iter__(self):
            return iter(records)

    assert list(given_records(Rows(), "cls", "train")) == want
    with pytest.raises(ValueError, match="^train: a list of records .dicts of fields. is needed, got dict"):
        given_records(records[0], "cls", "train")


def test_a_multilabel_label_list_becomes_text_labels_once_each_and_a_csv_cell_is_refused(tmp_path):
    assert [r["label"] for r in given_records(GOOD["multilabel"], "multilabel", "train")] == [["x", "1"], []]
    path = tmp_path / "records.csv"
    path.write_text("text,label\nhello,x\n")
    with pytest.raises(ValueError, match=f"^{path}:2: multilabel label .x. is not a list .*give JSON lines"):
        read_task_file(path, "multilabel")


@pytest.mark.parametrize("record, said", [
    ({"text": "a"}, "no field 'label'; the record has 'text'"),
    ({"text": "a", "label": {"x": 1}}, 'label {"x": 1} is not a string, number or boolean'),
    ({"text": ["a"], "label": "x"}, "text (column 'text') must be text (a string or number), got [\"a\"]"),
])
def test_a_bad_record_is_an_options_error_naming_the_argument_the_record_and_its_key(record, said):
    """A record lacking its label, or with a label or text of the wrong type, was a plain ValueError: it is
    the caller's argument, refused as an OptionsError whose field names it and whose line names the record."""
    records = [{"text": "b", "label": "y"}, record]
    with pytest.raises(OptionsError) as caught:
        given_records(records, "cls", "validation")
    assert str(caught.value) == f"validation:2: {said}" and caught.value.field == "validation"


@pytest.mark.parametrize("kind, record, said", [
    ("tagging", {"text": "a b", "words": ["a", "b"]}, "a tagging record has text or words (one of them)"),
    ("seq2seq", {"text": " "}, "text must be non-empty text"),
    ("seq2seq", {"text": None}, "text must be non-empty text"),
])
def test_a_record_to_predict_on_that_misuses_its_shorthand_is_an_options_error_naming_the_argument(
        kind, record, said):
    """predict_form's refusals (evaluate's records, /predict's) were plain ValueErrors: typed, the field
    the argument (or, called alone, the place it was given); the message the record and its key."""
    with pytest.raises(OptionsError) as caught:
        given_records([record], kind, "data", labelled=False)
    assert str(caught.value) == f"data:1: {said}" and caught.value.field == "data"
    with pytest.raises(OptionsError) as caught:
        predict_form(kind, record, "inputs.0")
    assert str(caught.value) == f"inputs.0: {said}" and caught.value.field == "inputs.0"


def test_records_listed_before_their_kind_was_known_are_checked_once_it_is():
    """A compression job lists records of no kind known yet (compress/measure.py); the same records given
    again with the kind were returned as they were, unchecked: now they are made canonical then."""
    listed = given_records([{"text": "good", "label": 1}], None, "data")
    assert given_records(listed, "cls", "data") == [{"line": 1, "text": "good", "label": "1"}]
    with pytest.raises(OptionsError, match="^data:1: ") as caught:
        given_records(given_records([{"txt": "good", "label": 1}], None, "data"), "cls", "data")
    assert caught.value.field == "data"
