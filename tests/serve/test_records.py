"""/predict's record check (serve/records.py) against the one lmforge evaluate and its Python face apply
(tasks/fields.py's given_records): a text record is refused or read alike, and read as the same record."""
import pytest

from lmforge.serve.limits import RequestError
from lmforge.serve.records import as_records
from lmforge.tasks.fields import given_records

T = "the cat sat on the mat"


def _python(kind: str, record: dict):
    """The record as evaluate reads it (its fields alone), or None where it is refused."""
    try:
        (read,) = given_records([record], kind, "data", labelled=False)
    except ValueError:
        return None
    return {k: v for k, v in read.items() if k != "line" and v is not None}


def _server(kind: str, record: dict):
    """The record as /predict reads it, or None where it is refused (422 naming a field of inputs.0)."""
    try:
        (read,) = as_records(kind, [record])
    except RequestError as err:
        assert err.status == 422 and err.param.startswith("inputs.0"), err
        return None
    return read


@pytest.mark.parametrize("kind, record", [
    ("cls", {"text": T}), ("cls", {"text": ""}), ("cls", {"text": "  \n"}),
    ("pair", {"text": T, "text_pair": "a dog"}), ("pair", {"text": T, "text_pair": ""}),
    ("pair", {"text": " ", "text_pair": "a dog"}),
    ("regression", {"text": T, "text_pair": ""}), ("regression", {"text": T, "text_pair": "  "}),
    ("regression", {"text": T}), ("multilabel", {"text": T, "text_pair": ""}), ("multilabel", {"text": "\t"}),
    ("tagging", {"words": ["the", "cat"]}), ("tagging", {"words": ["", "cat"]}),
    ("tagging", {"words": [" ", "cat"]}), ("tagging", {"words": []}),
    ("qa", {"question": "who?", "context": T}), ("qa", {"question": " ", "context": T}),
    ("qa", {"question": "who?", "context": ""}),
])
def test_predict_reads_and_refuses_a_record_as_evaluate_does(kind, record):
    # a blank text or word was scored by /predict where evaluate refused it; a regression text_pair ""
    # was encoded as an empty pair (another score) where evaluate reads no pair
    assert _server(kind, record) == _python(kind, record)


@pytest.mark.parametrize("kind, record", [
    ("cls", {"text": 3}), ("cls", {"text": True}), ("cls", {"text": 1.5}), ("cls", {"text": None}),
    ("cls", {"text": [T]}), ("regression", {"text": T, "text_pair": None}),
    ("regression", {"text": T, "text_pair": 3}),
    ("choice", {"text": T, "choices": ["a", 3]}), ("choice", {"text": T, "choices": ["a", None]}),
    ("choice", {"text": T, "choices": ["a", ""]}), ("choice", {"text": T, "choices": ["a", " "]}),
    ("choice", {"text": T, "choices": [["a"]]}), ("choice", {"text": 3, "choices": ["a"]}),
    ("choice", {"text": T * 500, "choices": ["a"]}), ("seq2seq", {"source": 3}),
    ("seq2seq", {"source": None}),
    ("seq2seq", {"source": " "}), ("qa", {"question": 7, "context": T}),
])
def test_a_text_that_is_not_a_string_is_read_or_refused_alike(kind, record):
    # a number in a text field was "3" to evaluate but refused by /predict, true was Python's "True", and a
    # null choice was scored as the text "None" by both
    assert _server(kind, record) == _python(kind, record)
    if record.get("text") is True:
        assert _python(kind, record)["text"] == "true"  # as JSON writes it, as a label's is
    if None in record.get("choices", ()):
        assert _python(kind, record) is None


@pytest.mark.parametrize("kind, item", [
    ("cls", T), ("regression", T), ("multilabel", T), ("pair", T), ("choice", T), ("qa", T), ("cls", " "),
    ("tagging", T), ("tagging", {"text": T}), ("tagging", {"text": " "}), ("tagging", {"text": 3}),
    ("tagging", {"text": T, "words": ["a"]}), ("seq2seq", T), ("seq2seq", {"text": T}), ("seq2seq", {}),
    ("seq2seq", {"text": T, "source": T}), ("seq2seq", {"text": ""}),
])
def test_predict_shorthands_are_read_alike(kind, item):
    # a bare string ({"text": it}), tagging's text (its words) and seq2seq's text (its source) were taken
    # by /predict alone; evaluate's Python records refused them
    assert _server(kind, item) == _python(kind, item)
    if item == {"text": T} and kind == "tagging":
        assert _python(kind, item) == {"words": T.split()}
