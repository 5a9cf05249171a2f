"""BM25 from bm25s: ranks the passage sharing the query's rare words first, reloads without pickle to
the same ranking, and gives hard negatives that are neither positives nor hold the answer."""
from __future__ import annotations

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
    with pytest.raises(ValueError, match=r"not a readable BM25 index"):
        BM25Index.load(tmp_path)


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
