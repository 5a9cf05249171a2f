"""BM25 from bm25s: ranks the passage sharing the query's rare words first, reloads without pickle to
the same ranking, refuses a changed file naming it, writes the same bytes whatever Python's hash seed,
indexes a passage without words as an empty document (and refuses passages with none), and gives hard
negatives that are neither positives nor hold the answer."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lmforge.retrieval.bm25 import BM25Index, hard_negatives
from lmforge.retrieval.passages import Passage, load_passages
from lmforge.retrieval.questions import builtin_questions

PASSAGES = [Passage("a", "Cats", "the cat sat on the mat"), Passage("b", "Dogs", "a dog barked at the moon"),
            Passage("c", "Birds", "birds sing at dawn near the river")]


def test_bm25_ranks_the_matching_passage_first_and_reloads(tmp_path):
    index = BM25Index.build(PASSAGES)
    positions, scores = index.search(["which dog barked", "river birds"], k=3)
    assert positions[:, 0].tolist() == [1, 2]
    assert (np.diff(scores, axis=1) <= 0).all()  # best first
    again = BM25Index.load(index.save(tmp_path / "bm25"))
    assert np.array_equal(again.search(["which dog barked"], 3)[0], positions[:1])
    assert not list(tmp_path.rglob("*.pkl"))


def test_a_damaged_bm25_directory_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"manifest.json: missing"):
        BM25Index.load(tmp_path)


def _flip_last_byte(file):
    data = bytearray(file.read_bytes())
    data[-1] ^= 1
    file.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy",
                                  "vocab.index.json", "params.index.json"])
def test_a_changed_or_missing_file_is_refused_naming_it(tmp_path, name):
    index = BM25Index.build(PASSAGES).save(tmp_path / "bm25")
    _flip_last_byte(index / name)
    with pytest.raises(ValueError, match=rf"{name}: checksum does not match"):
        BM25Index.load(index)
    (index / name).unlink()
    with pytest.raises(ValueError, match=rf"{name}: missing"):
        BM25Index.load(index)


def test_a_manifest_whose_count_is_not_the_index_is_refused(tmp_path):
    index = BM25Index.build(PASSAGES).save(tmp_path / "bm25")
    manifest = json.loads((index / "manifest.json").read_text())
    (index / "manifest.json").write_text(json.dumps({**manifest, "count": 1}))
    with pytest.raises(ValueError, match=r"manifest.json: count 1 is not the index's 3 passages"):
        BM25Index.load(index)
    (index / "manifest.json").write_text(json.dumps({**manifest, "sha256": {"params.index.json": "0"}}))
    with pytest.raises(ValueError, match=r"lists no checksum of data.csc.index.npy"):
        BM25Index.load(index)


BUILD = """import hashlib, json, sys
from pathlib import Path
from lmforge.retrieval.bm25 import BM25Index
from lmforge.retrieval.passages import load_passages
out = BM25Index.build(load_passages(None)).save(Path(sys.argv[1]))
files = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in out.iterdir()}
print(json.dumps([hash("lmforge"), files]))
"""


def test_the_files_are_the_same_bytes_whatever_the_hash_seed(tmp_path):
    # built here and in a process of another hash seed (a second process cost seconds of imports)
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    run = subprocess.run([sys.executable, "-c", BUILD, str(tmp_path / "there")], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": seed})
    assert run.returncode == 0, run.stderr[-2000:]
    hashed, there = json.loads(run.stdout)
    here = BM25Index.build(load_passages(None)).save(tmp_path / "here")
    assert hashed != hash("lmforge")  # the two processes hash strings differently
    assert there == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in here.iterdir()}
    assert "vocab.index.json" in there


def test_a_passage_without_words_is_an_empty_document_and_none_with_words_is_refused():
    index = BM25Index.build([*PASSAGES, Passage("e", "t", ""), Passage("f", "a", "the of and")])
    positions, scores = index.search(["dog moon"], k=5)
    assert positions[0, 0] == 1 and set(positions[0, scores[0] == 0].tolist()) >= {3, 4}  # they score 0
    said = r"^empty.jsonl: no passage has a word BM25 can index \(passage 'e', 'f'"
    with pytest.raises(ValueError, match=said):
        BM25Index.build([Passage("e", "t", ""), Passage("f", "a", "the of and")], where="empty.jsonl")


def test_hard_negatives_are_not_positives_nor_hold_the_answer():
    passages = load_passages(None)
    records = builtin_questions(passages)["train"][:60]
    index = BM25Index.build(passages)
    by_id = {p.id: p for p in passages}
    negatives = hard_negatives(index, records, passages, n=2)
    assert sum(map(len, negatives)) >= 100
    for r, ids in zip(records, negatives):
        assert not set(ids) & set(r["positives"])
        assert all(r["answers"][0] not in by_id[i].text for i in ids)


def test_scores_are_bm25s_own_and_tied_passages_rank_the_lower_position_first():
    import bm25s

    passages = [Passage(str(i), "t", "river bank" if i % 3 == 0 else f"mountain peak w{i}")
                for i in range(600)]
    index = BM25Index.build(passages)
    positions, scores = index.search(["river", "peak w7 river", "the"], k=50)
    reference = bm25s.BM25()
    reference.index(bm25s.tokenize([f"{p.title} {p.text}" for p in passages], stopwords="en",
                                   show_progress=False), show_progress=False)
    for query, row in zip(["river", "peak w7 river"], scores):
        _, want = reference.retrieve(bm25s.tokenize([query], stopwords="en", show_progress=False), k=50,
                                     show_progress=False)
        assert np.allclose(row, want[0])  # the same scores, best first
    assert positions[0].tolist() == list(range(0, 150, 3))  # 200 tied: the lowest 50, in order
    assert positions[1, 0] == 7 and positions[1, 1:].tolist() == list(range(0, 147, 3))
    assert positions[2].tolist() == list(range(50)) and not scores[2].any()  # no word: all 0, first rows
    assert np.array_equal(index.search(["river"], 7)[0][0], positions[0, :7])  # a smaller k: its prefix


def test_a_search_holds_one_querys_scores_at_a_time(monkeypatch):
    import lmforge.retrieval.bm25 as bm25

    index, seen, real = BM25Index.build(PASSAGES), [], bm25.top_k
    monkeypatch.setattr(bm25, "top_k", lambda scores, k: seen.append(tuple(scores.shape)) or real(scores, k))
    positions, _ = index.search(iter(["which dog barked", "river birds", "cat"]), k=2)  # any iterable
    assert seen == [(1, 3)] * 3 and positions[:, 0].tolist() == [1, 2, 0]


def test_more_hard_negatives_than_the_default_depth_are_found_when_asked():
    passages = load_passages(None)
    records = builtin_questions(passages)["train"][:5]
    negatives = hard_negatives(BM25Index.build(passages), records, passages, n=40)
    assert all(len(ids) == 40 and len(set(ids)) == 40 for ids in negatives)  # 184 passages: 40 are there


def test_a_passage_holding_the_answer_in_another_case_is_no_hard_negative():
    passages = [Passage("0", "Mupi", "Mupi lies on the Rhine."),
                Passage("1", "Lore", "RHINE tales of Mupi lore."),
                Passage("2", "Other", "Mupi has a small market.")]
    records = [{"question": "Which river flows through Mupi?", "answers": ["Rhine"], "positives": ["0"]}]
    assert hard_negatives(BM25Index.build(passages), records, passages, n=2) == [["2"]]


def test_a_passage_holding_the_answer_in_other_spacing_or_unicode_form_is_no_hard_negative():
    passages = [Passage("0", "Mupi", "Mupi lies by Jean-Paul's cafe."),
                Passage("1", "Lore", "Mupi tales of Jean - Paul and his Cafe\u0301 Noir."),
                Passage("2", "Other", "Mupi has a small market and a cafe.")]
    records = [{"question": "Who keeps the cafe in Mupi?", "answers": ["Jean-Paul", "Café Noir"],
                "positives": ["0"]}]
    assert hard_negatives(BM25Index.build(passages), records, passages, n=2) == [["2"]]  # as DPR's has_answer


def test_a_passage_holding_the_answer_only_inside_a_longer_word_is_a_hard_negative():
    """DPR's has_answer alone decides (whole words): 'Romeo' does not hold the answer 'Rome', nor '1990'
    the answer '1', so those passages are real negatives; 'ROME,' holds it."""
    passages = [Passage("0", "Mupi", "Mupi was founded from Rome."),
                Passage("1", "Lore", "Mupi tales of Romeo, told since 1990."),
                Passage("2", "Other", "Mupi traders went to ROME, by sea.")]
    records = [{"question": "From which city was Mupi founded?", "answers": ["Rome", "1"],
                "positives": ["0"]}]
    assert hard_negatives(BM25Index.build(passages), records, passages, n=2) == [["1"]]
