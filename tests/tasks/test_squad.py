"""SQuAD files and scores: reading v1.1 / v2.0 JSON with its checks, the official exact match and F1."""
from __future__ import annotations

import json
import re

import pytest

from lmforge.config.options import OptionsError
from lmforge.tasks.squad import exact_match, normalize_answer, read_squad, squad_scores, token_f1


# ---- SQuAD scores ---------------------------------------------------------------------------------


def test_squad_normalisation_and_golden_scores():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("an apple, a pear and theatre") == "apple pear and theatre"
    assert exact_match("the Eiffel Tower", "Eiffel tower!") == 1.0
    assert token_f1("the Eiffel Tower", "Eiffel tower!") == 1.0
    assert token_f1("Paris, France", "in Paris") == pytest.approx(0.5)
    assert token_f1("x b c", "b c d e") == pytest.approx(2 * (2 / 4) * (2 / 3) / (2 / 4 + 2 / 3))
    assert token_f1("a b c", "b c d e") == pytest.approx(2 * (2 / 4) * 1 / (2 / 4 + 1))  # "a" is dropped
    assert token_f1("x", "y") == 0.0 and token_f1("the", "") == 1.0 and token_f1("x", "") == 0.0
    records = [{"answers": [{"text": "Denver Broncos", "start": 0}, {"text": "the Broncos", "start": 0}]},
               {"answers": [{"text": "1990", "start": 0}]},
               {"answers": []}, {"answers": []}]
    scores = squad_scores(records, ["Broncos", "in 1990", "", "Paris"])
    # best over golds: Broncos vs "the Broncos" -> EM 1; "in 1990" -> F1 2/3; "" vs [] -> 1; "Paris" -> 0
    assert scores["exact_match"] == pytest.approx(2 / 4)
    assert scores["f1"] == pytest.approx((1 + 2 / 3 + 1) / 4)
    assert list(scores)[:2] == ["f1", "exact_match"]
    assert scores["has_answer_f1"] == pytest.approx((1 + 2 / 3) / 2)
    assert scores["no_answer_exact_match"] == 0.5
    assert set(squad_scores(records[:2], ["Broncos", "1990"])) == {"f1", "exact_match"}


def test_answerable_only_records_are_scored_by_the_squad_1_1_script():
    # golds that normalise to nothing: the official v1.1 evaluate script counts them (EM) and gives F1 0
    # where a side is empty; v2.0's drops them. Values below: v1.1's and v2.0's evaluate-v*.py on these.
    v1 = squad_scores([{"answers": [{"text": "the"}, {"text": "the cat"}]}], ["the"])
    assert v1 == {"f1": 0.0, "exact_match": 1.0}  # v1.1: exact_match 100.0, f1 0.0
    assert squad_scores([{"answers": [{"text": "The"}]}], ["the"]) == {"f1": 0.0, "exact_match": 1.0}
    v2 = squad_scores([{"answers": [{"text": "the"}, {"text": "the cat"}]}, {"answers": []}], ["the", ""])
    assert v2["has_answer_exact_match"] == 0.0 and v2["no_answer_f1"] == 1.0  # v2.0: HasAns_exact 0.0
    assert token_f1("the", "", empty_match=False) == 0.0 and token_f1("the", "") == 1.0


# ---- reading SQuAD JSON -----------------------------------------------------------------------------

SQUAD = {"version": "v2.0", "data": [{"title": "T", "paragraphs": [
    {"context": "Normandy is a region in France.",
     "qas": [{"id": "a1", "question": "Where is Normandy?",
              "answers": [{"text": "France", "answer_start": 24}],
              "is_impossible": False},
             {"id": "a2", "question": "Who ate Normandy?", "answers": [],
              "plausible_answers": [{"text": "France", "answer_start": 24}], "is_impossible": True}]}]}]}


def test_read_squad_v1_and_v2(tmp_path):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(SQUAD, indent=1), encoding="utf-8")
    records = read_squad(path)
    assert records == [
        {"id": "a1", "question": "Where is Normandy?", "context": "Normandy is a region in France.",
         "answers": [{"text": "France", "start": 24}], "line": 1},
        {"id": "a2", "question": "Who ate Normandy?", "context": "Normandy is a region in France.",
         "answers": [], "line": 2}]


def test_read_squad_takes_is_impossible_as_1_or_0(tmp_path):
    data = json.loads(json.dumps(SQUAD))
    qas = data["data"][0]["paragraphs"][0]["qas"]
    qas[0]["is_impossible"], qas[1]["is_impossible"] = 0, 1  # as some converters write the flags
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert read_squad(path) == read_squad_of(tmp_path, SQUAD)  # 0 is false, 1 is true
    assert [r["answers"] != [] for r in read_squad(path)] == [True, False]


def read_squad_of(tmp_path, data) -> list:
    """read_squad of a SQuAD document written to a file."""
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return read_squad(path)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(answer_start=3),
     r"data\[0\].paragraphs\[0\].qas\[0\].answers\[0\]: answer 'France' is not at character 3"),
    # a negative start reads from the context's end: "France" at -7 was taken, its tokens found nowhere
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(answer_start=-7),
     r"answers\[0\]: answer 'France' is not at character -7 of the context"),
    # "" (or blanks) is "found" at any start, and covers no token: it trained as unanswerable
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(text="", answer_start=500),
     r"qas\[0\].answers\[0\]: the answer text is empty"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(text=" ", answer_start=8),
     r"qas\[0\].answers\[0\]: the answer text is empty"),
    # gold answers on an unanswerable question: dropped unsaid, where the official script scores them
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(is_impossible=True),
     r"qas\[0\]: is_impossible is true but the question has 1 answer\(s\)"),
    (lambda d: d["data"][0]["paragraphs"][0].update(context=" "), r"paragraphs\[0\].context: empty text"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].update(question=""), r"qas\[1\].question: empty text"),
    # a lone surrogate (JSON's \ud800) was read, then refused by the tokenizer naming no file
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].update(question="who \ud800"),
     r"qas\[1\].question is not valid Unicode: surrogates not allowed at position 4"),
    (lambda d: d["data"][0]["paragraphs"][0].update(context="a \udfff b"),
     r"paragraphs\[0\].context is not valid Unicode"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].pop("question"),
     r"data\[0\].paragraphs\[0\].qas\[1\]: missing 'question'"),
    (lambda d: d.pop("data"), "missing 'data'"),
    (lambda d: d["data"][0]["paragraphs"][0].update(context=7),
     r"paragraphs\[0\].context: expected str, got int"),
    # a string "false" is truthy: the answerable question was read as unanswerable, its answers dropped
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(is_impossible="false"),
     r"qas\[0\].is_impossible: expected true / false \(or 1 / 0\), got \"false\""),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(is_impossible="0"),
     r"qas\[0\].is_impossible: expected true / false \(or 1 / 0\), got \"0\""),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(is_impossible=2),
     r"qas\[0\].is_impossible: expected true / false \(or 1 / 0\), got 2"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(is_impossible=0.5),
     r"qas\[0\].is_impossible: expected true / false \(or 1 / 0\), got 0.5"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(is_impossible=None),
     r"qas\[0\].is_impossible: expected true / false \(or 1 / 0\), got null"),
    # the predictions the official script reads are a dict id -> answer: a repeated id loses one
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].update(id="a1"),
     r"bad.json: data\[0\].paragraphs\[0\].qas\[1\].id: 'a1' is the id of an earlier question too "
     r"\(data\[0\].paragraphs\[0\].qas\[0\]\)"),
    (lambda d: d["data"].append({"paragraphs": [{"context": "x", "qas": [
        {"id": 7, "question": "q", "answers": []}, {"id": "7", "question": "q", "answers": []}]}]}),
     r"data\[1\].paragraphs\[0\].qas\[1\].id: '7' is the id of an earlier question too"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(answer_start=True),
     r"answers\[0\].answer_start: expected int, got bool"),
])
def test_read_squad_errors_say_where(tmp_path, mutate, message):
    data = json.loads(json.dumps(SQUAD))
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(OptionsError, match=message) as err:
        read_squad(path)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)
    assert err.value.field is None  # the file's fault: the message names it and where in it


def test_read_squad_bad_bytes_and_bad_json_name_the_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b'{"data": [\n{"title": "caf\xe9"}]}')
    with pytest.raises(OptionsError, match=rf"^{path}: line 2: not valid UTF-8 \(byte 0xe9\)") as err:
        read_squad(path)
    assert err.value.field is None
    path.write_text('{"data": [\n\n{"title": }]}', encoding="utf-8")
    with pytest.raises(OptionsError, match=rf"^{path}: line 3 column 11: not valid JSON") as err:
        read_squad(path)
    assert err.value.field is None


@pytest.mark.parametrize("data, message", [
    ([{"question": "Who?", "context": "Ann ran.", "answers": []}], ": missing 'data'"),
    ({"version": "v2.0", "data": {"title": "T"}}, ".data: expected list, got dict"),
    ({"data": [{"title": "T", "paragraphs": [{"context": "Ann ran.", "questions": []}]}]},
     r": data\[0\].paragraphs\[0\]: missing 'qas'"),
    ({"data": []}, ": no questions"),
])
def test_a_file_not_of_squad_s_shape_is_an_options_error_naming_it(tmp_path, data, message):
    """A JSON file that is not SQuAD (a list of records, data not a list, SQuAD's keys renamed) is refused
    with lmforge's typed error naming the file and where in it, never read as no questions."""
    path = tmp_path / "other.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(OptionsError, match=rf"^{re.escape(str(path))}{message}$") as err:
        read_squad(path)
    assert err.value.field is None
