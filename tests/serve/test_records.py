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


# each kind's record to predict on, and the gold fields evaluate reads in it (and ignores to predict)
GOLD = [
    ("cls", {"text": T}, {"label": "pos"}), ("pair", {"text": T, "text_pair": "a dog"}, {"label": 1}),
    ("regression", {"text": T}, {"label": "2.5"}), ("multilabel", {"text": T}, {"label": ["a", "b"]}),
    ("choice", {"text": T, "choices": ["a", "b"]}, {"label": 1}),
    ("tagging", {"words": ["the", "cat"]}, {"tags": ["O", "B-X"]}),
    ("tagging", {"text": T}, {"tags": ["O"] * 6}),
    ("qa", {"question": "who?", "context": T}, {"id": 7, "answers": [{"text": "cat", "start": 4}]}),
    ("seq2seq", {"source": T}, {"target": "le chat"}), ("seq2seq", {"text": T}, {"target": 3}),
    ("cls", {"text": T}, {"label": None}), ("regression", {"text": T}, {"label": ""}),
]


@pytest.mark.parametrize("kind, record, gold", GOLD)
def test_a_record_with_its_gold_is_predicted_as_without_it(kind, record, gold):
    # /predict refused a record's gold (label, tags, answers, target, qa's id) as an unknown field where
    # lmforge evaluate reads it: the record the model is given (as_records') is the same with it or without
    assert as_records(kind, [{**record, **gold}]) == as_records(kind, [record])
    assert _python(kind, {**record, **gold}) is not None


@pytest.mark.parametrize("kind, record, field, bad", [
    ("cls", {"text": T}, "label", [1]), ("cls", {"text": T}, "label", " "),
    ("pair", {"text": T, "text_pair": T}, "label", {"a": 1}), ("regression", {"text": T}, "label", "high"),
    ("regression", {"text": T}, "label", "nan"), ("multilabel", {"text": T}, "label", "a"),
    ("choice", {"text": T, "choices": ["a", "b"]}, "label", 2),
    ("choice", {"text": T, "choices": ["a", "b"]}, "label", 0.5),
    ("tagging", {"words": ["the", "cat"]}, "tags", ["O"]), ("tagging", {"text": T}, "tags", ["O", ""] * 3),
    ("qa", {"question": "who?", "context": T}, "answers", [{"text": "dog", "start": 4}]),
    ("qa", {"question": "who?", "context": T}, "answers", "cat"),
    ("qa", {"question": "q", "context": T}, "id", 1.5),
    ("seq2seq", {"source": T}, "target", ["le"]), ("seq2seq", {"text": T}, "target", "  "),
])
def test_a_bad_gold_value_is_refused_by_both_faces_naming_it(kind, record, field, bad):
    given = {**record, field: bad}
    with pytest.raises(ValueError, match=field):  # evaluate names the record and the field
        given_records([given], kind, "data", labelled=False)
    for inputs, where in ((given, f"inputs.{field}"), ([record, given], f"inputs.1.{field}")):
        with pytest.raises(RequestError) as err:
            as_records(kind, inputs)
        assert (err.value.status, err.value.param) == (422, where)
        assert err.value.message.startswith(where + ": ")


def test_a_label_spelt_two_ways_is_refused_across_inputs_as_across_evaluates_records():
    records = [{"text": T, "label": 1}, {"text": T, "label": "1"}]
    with pytest.raises(ValueError, match="also spelled"):
        given_records(records, "cls", "data", labelled=False)
    with pytest.raises(RequestError, match=r"inputs\.1\.label: .*also spelled 1 \(inputs\.0\)"):
        as_records("cls", records)


@pytest.mark.parametrize("kind, record", [
    ("pair", {"text": T, "text_pairr": T}), ("cls", {"text": T, "lable": "pos"}),
    ("tagging", {"words": ["a"], "tag": ["O"]}), ("qa", {"question": "q", "context": T, "answer": []}),
    ("seq2seq", {"source": T, "targets": "x"}), ("cls", {"text": T, "line": 3}),
])
def test_a_field_no_record_of_the_kind_has_is_still_refused(kind, record):
    # a request body is a typed call: a misspelt field is a 422 naming it, never silently dropped
    (field,) = set(record) - {"text", "words", "source", "question", "context"}
    with pytest.raises(RequestError, match=f"unknown field.s. {field} ") as err:
        as_records(kind, [record])
    assert err.value.status == 422 and err.value.param.startswith("inputs.0.")


@pytest.fixture(scope="module")
def choice_client(tmp_path_factory):
    """A TestClient of a tiny multiple-choice model (max_len 64) under a 2000-token request limit."""
    from fastapi.testclient import TestClient

    from lmforge.serve import create_app, load_served
    from lmforge.serve.limits import Limits
    from tests.serve.conftest import _task, _tokenizer

    path = _task("choice", None, _tokenizer("bert"), tmp_path_factory.mktemp("choice") / "choice", 6)
    app = create_app({"choice": load_served("choice", path)}, Limits(max_request_tokens=2000), threads=1)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def test_record_texts_are_the_sequences_the_task_reads():
    from types import SimpleNamespace

    from lmforge.serve.records import choice_tokens, record_texts

    choice = {"text": T, "choices": ["a dog", "a fox"]}
    assert record_texts(SimpleNamespace(kind="choice"), choice) == [(T, "a dog"), (T, "a fox")]
    assert record_texts(SimpleNamespace(kind="pair"), {"text": T, "text_pair": "x"}) == [(T, "x")]
    seq2seq = SimpleNamespace(kind="seq2seq", source=lambda r: f"summarize: {r['source']}")
    assert record_texts(seq2seq, {"source": T}) == [(f"summarize: {T}", None)]  # its prefix is read too
    assert choice_tokens([12, 30, 20], 64) == 90 and choice_tokens([12, 90], 64) == 128  # padded, cut


@pytest.mark.parametrize("truncate", [False, True])
def test_a_choice_record_pays_for_every_choice_it_reads(choice_client, truncate):
    # 3000 choices of 64 tokens each were counted as one 64-token text under truncate: a forward pass of
    # 192000 tokens passed a 2000-token limit
    many = {"text": T * 5, "choices": ["on the mat near the river"] * 300}
    found = choice_client.post("/predict", json={"inputs": many, "truncate": truncate})
    assert found.status_code == 413, found.text
    assert found.json()["error"]["param"] == "max_request_tokens"


def test_a_choice_record_is_bounded_by_its_longest_choice_not_by_all_its_texts(choice_client):
    # each (text, choice) fits max_len=64; the record's texts together do not, and were refused
    record = {"text": T * 3, "choices": [T * 3, T * 2, T]}
    found = choice_client.post("/predict", json={"inputs": [record]})
    assert found.status_code == 200, found.text
    assert len(found.json()["predictions"][0]["scores"]) == 3
    too_long = {"text": T * 6, "choices": ["a dog", T * 6]}
    refused = choice_client.post("/predict", json={"inputs": too_long})
    assert refused.status_code == 413 and "longest choice" in refused.json()["error"]["message"]


@pytest.mark.parametrize("kind, record, field", [
    ("cls", {"text": "a \ud800"}, "text"), ("pair", {"text": T, "text_pair": "b \udc80"}, "text_pair"),
    ("qa", {"question": "who\udc80?", "context": T}, "question"),
    ("choice", {"text": T, "choices": ["a", "b \ud800"]}, "choices.1"),
])
def test_a_lone_surrogate_is_refused_by_both_faces_naming_the_field(kind, record, field):
    """A JSON "\\ud800" in a text: evaluate's records refuse it by checked_text's rule (4dc11387), while
    /predict took it on to the tokenizer, whose error named no field of inputs."""
    with pytest.raises(RequestError) as refused:
        as_records(kind, [record])
    assert _python(kind, record) is None and refused.value.param == f"inputs.0.{field}"
    assert "is not valid Unicode: surrogates not allowed" in str(refused.value)
