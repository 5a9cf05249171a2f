"""Passages and question files: 100-word blocks with ids and titles, built-in questions whose
positives state the answer, user files read with one-line errors naming file and line."""
from __future__ import annotations

import json
import re

import pytest

from lmforge.config.options import OptionsError
from lmforge.retrieval.passages import (Passage, load_passages, passages_from_documents, read_passages,
                                        split_words, write_passages)
from lmforge.retrieval.questions import builtin_questions, check_positives, read_questions


def test_split_words_shares_words_evenly_and_keeps_them_all():
    text = " ".join(f"w{i}" for i in range(250))
    chunks = split_words(text, 100)
    assert [len(c.split()) for c in chunks] == [125, 125]  # round(2.5) = 2 blocks, no 50-word tail
    assert " ".join(chunks) == text
    assert [len(c.split()) for c in split_words(" ".join(["x"] * 310), 100)] == [103, 104, 103]
    assert split_words("   ") == []


def test_passages_have_unique_ids_and_their_document_titles():
    docs = [("A", " ".join(["a"] * 230)), ("B", "short text")]
    ps = passages_from_documents(docs, 100)
    assert [(p.id, p.title) for p in ps] == [("0", "A"), ("1", "A"), ("2", "B")]


def test_builtin_passages_and_questions_are_seeded_and_positives_state_the_answer():
    ps = load_passages("builtin", seed=3)
    assert [p.text for p in ps] == [p.text for p in load_passages(None, seed=3)]
    qs = builtin_questions(ps, seed=3)
    assert qs == builtin_questions(load_passages(None, seed=3), seed=3)
    by_id = {p.id: p for p in ps}
    records = [r for part in qs.values() for r in part]
    assert len(records) > 300
    for r in records:
        assert all(r["answers"][0] in by_id[i].text for i in r["positives"])
    # split by entity: no name asked about in test is asked about in train
    subject = lambda q: q.rstrip("?").split(" born")[0].split("of ")[-1].split("was ")[-1]  # noqa: E731
    assert not {subject(r["question"]) for r in qs["test"]} & {subject(r["question"]) for r in qs["train"]}


def test_text_files_become_titled_passages(tmp_path):
    (tmp_path / "notes.txt").write_text("First doc line one.\nLine two.\n\nSecond doc.\n")
    ps = load_passages(str(tmp_path / "notes.txt"))
    assert [(p.title, p.text) for p in ps] == [("notes 1", "First doc line one. Line two."),
                                               ("notes 2", "Second doc.")]


def test_passage_file_round_trip_and_bad_lines(tmp_path):
    ps = [Passage("a", "T", "one two"), Passage("b", "U", "three")]
    path = write_passages(ps, tmp_path / "p.jsonl")
    assert read_passages(path) == ps and load_passages(str(path)) == ps
    path.write_text(path.read_text() + '{"id": "a", "title": "x", "text": "y"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl: line 3: passage id 'a' repeated"):
        read_passages(path)
    path.write_text('{"id": "a", "title": "x"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl: line 1: field 'text' missing"):
        read_passages(path)


def test_a_byte_that_is_not_utf8_is_named_with_file_and_line(tmp_path):
    """A passages or questions JSONL that is not UTF-8 said only "'utf-8' codec can't decode byte 0xff"."""
    passages = tmp_path / "p.jsonl"
    passages.write_bytes(b'{"id": "a", "title": "T", "text": "one"}\n{"id": "b", "title": "\xff"}\n')
    for read in (read_passages, load_passages):
        with pytest.raises(ValueError, match=r"p.jsonl: line 2: not valid UTF-8 \(byte 0xff at column 23\)"):
            read(str(passages))
    passages.write_bytes(b'{"id": "a", "title": "\xff", "text": "one"}\n')  # the line load_passages peeks at
    with pytest.raises(ValueError, match=r"p.jsonl: line 1: not valid UTF-8"):
        load_passages(str(passages))
    questions = tmp_path / "q.jsonl"
    questions.write_bytes(b'{"question": "Who\xff?", "answers": ["x"], "context": "x"}\n')
    with pytest.raises(ValueError, match=r"q.jsonl: line 1: not valid UTF-8 \(byte 0xff"):
        read_questions(questions)


def test_qa_jsonl_and_squad_files(tmp_path):
    good = tmp_path / "qa.jsonl"
    good.write_text(json.dumps({"question": "Who?", "answers": ["Ann"], "context": "Ann did it."}) + "\n"
                    + json.dumps({"question": "Ann?", "answers": ["yes"], "context": "Ann did it."}) + "\n")
    records, passages = read_questions(good)
    assert [r["positives"] for r in records] == [["0"], ["0"]] and passages[0].text == "Ann did it."
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "Who?", "answers": ["Ann"], "context": "c"})
                   + "\n{\"answers\": []}\n")
    with pytest.raises(ValueError, match=r"bad.jsonl: line 2: field 'question' missing"):
        read_questions(bad)
    bad.write_text(json.dumps({"question": "Who?", "answers": "Ann", "context": "c"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl: line 1: field 'answers' must be a list"):
        read_questions(bad)
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps({"data": [{"paragraphs": [{"context": "Bo met Cy.", "qas": [
        {"id": "1", "question": "Who met Cy?", "answers": [{"text": "Bo", "answer_start": 0}]}]}]}]}))
    records, passages = read_questions(squad)
    assert records == [{"question": "Who met Cy?", "answers": ["Bo"], "positives": ["0"]}]
    with pytest.raises(ValueError, match=r"q.jsonl: question 1: positive passage id '9'"):
        check_positives([{"positives": ["9"]}], passages, "q.jsonl")


@pytest.mark.parametrize("record, said", [
    # a lone surrogate was refused mid-training as "text is not valid Unicode", naming no file
    ({"question": "who \ud800", "answers": ["a"], "context": "a b"}, "field 'question' is not valid Unicode"),
    ({"question": "who", "answers": ["a\udfff"], "context": "a b"}, "field 'answers[0]' is not valid"),
    ({"question": "who", "answers": ["a"], "context": "a \ud800"}, "field 'context' is not valid Unicode"),
    # trained on and scored silently (a query needs words); a passage of no words
    ({"question": "   ", "answers": ["a"], "context": "a b"}, "field 'question' is blank"),
    ({"question": "who", "answers": ["a"], "context": ""}, "field 'context' is blank"),
])
def test_a_question_or_context_that_is_blank_or_not_unicode_is_refused_naming_line_and_field(tmp_path, record,
                                                                                             said):
    path = tmp_path / "qa.jsonl"
    good = json.dumps({"question": "Who?", "answers": ["Ann"], "context": "Ann did it."})
    path.write_text(good + "\n" + json.dumps(record) + "\n")  # JSON's escapes: the lone surrogate itself
    with pytest.raises(ValueError, match=rf"qa\.jsonl: line 2: {re.escape(said)}"):
        read_questions(path)


@pytest.mark.parametrize("record, said", [
    # a lone surrogate failed the index build's write as "'utf-8' codec can't encode", naming no file
    ({"id": "b", "title": "t", "text": "x \ud800 y"}, "field 'text' is not valid Unicode"),
    ({"id": "b", "title": "t \ud800", "text": "x y"}, "field 'title' is not valid Unicode"),
    ({"id": "b\udfff", "title": "t", "text": "x y"}, "field 'id' is not valid Unicode"),
])
def test_a_passage_not_valid_unicode_is_refused_naming_line_and_field(tmp_path, record, said):
    path = tmp_path / "passages.jsonl"
    first = json.dumps({"id": "a", "title": "t", "text": "the cat"})
    path.write_text(first + "\n" + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=rf"passages\.jsonl: line 2: {re.escape(said)}"):
        read_passages(path)


def test_passages_without_string_text_are_refused_naming_the_file(tmp_path):
    import warnings

    from lmforge.retrieval.passages import load_passages

    typed = tmp_path / "typed.jsonl"
    typed.write_text('{"id": 1, "title": "a", "text": 5}\n')  # a number is not a passage's text
    with pytest.raises(ValueError, match=r"typed\.jsonl: line 1: field 'text' missing or not a string"):
        load_passages(str(typed))
    bare = tmp_path / "bare.jsonl"
    bare.write_text('{"text": 5}\n')
    with warnings.catch_warnings(), pytest.raises(ValueError, match=r"bare\.jsonl: no passages"):
        warnings.simplefilter("ignore")
        load_passages(str(bare))


def test_the_reader_refuses_an_unanswerable_question_before_any_work(tmp_path):
    """A SQuAD 2.0 file's unanswerable question reached the reader's exact match as max() of nothing."""
    from lmforge.retrieval.jobs import run_reader
    from lmforge.retrieval.questions import check_answers
    from lmforge.train import TrainConfig

    lines = [{"question": f"Who {i}?", "answers": [] if i == 3 else ["Ann"], "context": f"Ann {i}."}
             for i in range(12)]
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(ValueError, match=r"q.jsonl: question 4 has no answer"):
        run_reader("no-such-model", tmp_path / "out", TrainConfig(steps=1), questions=str(questions))
    assert not (tmp_path / "out" / "checkpoints").exists()
    check_answers([{"answers": ["a"]}], "q.jsonl")  # answered: nothing said


@pytest.mark.parametrize("source", ["", "  ", 3, b"passages.jsonl", ["a.txt"]])
def test_passages_that_name_no_file_are_an_options_error_naming_passages(source):
    """"" read every file under the working folder as passages; a number, bytes or a list failed in
    pathlib."""
    with pytest.raises(OptionsError, match="passages must be") as caught:
        load_passages(source)
    assert caught.value.field == "passages"


@pytest.mark.parametrize("words", [True, 0, 10 ** 12, 2.5])
def test_a_passage_window_is_a_whole_count_within_index_options_bounds(words):
    """load_passages reads `words` as IndexOptions.words is bounded: True was a window of 1 word."""
    with pytest.raises(OptionsError) as caught:
        load_passages(None, words=words)
    assert caught.value.field == "words"


@pytest.mark.parametrize("answer", ["", "  ", "...", "-", "_"])
def test_an_answer_empty_once_normalised_is_refused_naming_the_question(answer):
    """Exact match normalises both sides (SQuAD's): such a gold answer matched an empty prediction, so a
    model answering nothing scored."""
    from lmforge.retrieval.questions import check_answers

    with pytest.raises(ValueError, match=rf"q.jsonl: question 2: answer {answer!r} is empty once normalised"):
        check_answers([{"answers": ["Ann"]}, {"answers": ["Bob", answer]}], "q.jsonl")
    # articles alone are words (SQuAD's scoring normalises them away too); a symbol is itself
    check_answers([{"answers": ["A", "the", "€", "3", "東京"]}], "q.jsonl")
