"""The reverse-dictionary questions: each restates a definition with other entries' words (never
the answer's), points at the entry that answers it, and on the real dictionary BM25 alone misses
some of them."""
from __future__ import annotations

import random

import pytest

from lmforge.retrieval.dictionary_qa import PREFIX, dictionary_questions, paraphrase, synonyms
from tests import requires

ENTRIES = [("Wayfarer", "noun", "One who travels; a traveler; a passenger."),
           ("Traveler", "noun", "One who journeys; a wayfarer."),
           ("Travel", "verb", "To journey; to go from place to place."),
           ("Quick", "adjective", "Nimble; rapid; fast."),
           ("Swift", "adjective", "Moving a great distance in a short time; rapid; fleet."),
           ("Passenger", "noun", "A rider; one who rides in a vehicle."),
           ("Rider", "noun", "One who rides; a passenger."),
           ("Nimble", "adjective", "Quick; agile; lively (Obs.)."),
           ("Agile", "adjective", "Nimble; lively; active.")]


def test_synonyms_go_both_ways_and_skip_function_words():
    table = synonyms(ENTRIES)
    assert "traveler" in table["wayfarer"] and "wayfarer" in table["traveler"]  # gloss -> headword, back
    assert "nimble" in table["quick"] and "quick" in table["nimble"]
    assert all(w not in table for w in ("one", "who", "a", "to"))


def test_a_paraphrase_swaps_content_words_but_never_uses_the_answer():
    table = synonyms(ENTRIES)
    text, swapped, kept = paraphrase("One who rides; a passenger.", "Rider", table, random.Random(0))
    assert swapped >= 1 and "rider" not in text.lower() and "rides" in text  # rides has no synonym
    assert kept == 1
    text, swapped, _ = paraphrase("Nimble; rapid (Obs.).", "Quick", table, random.Random(0))
    assert "quick" not in text.lower() and "Obs" not in text and swapped >= 1


def test_questions_point_at_the_entry_that_answers_them():
    passages, sets = dictionary_questions(n_passages=9, n_test=1, min_swapped=1, entries=ENTRIES)
    by_id = {p.id: p for p in passages}
    records = sets["train"] + sets["test"]
    assert len(records) >= 3 and len(sets["test"]) == 1
    for r in records:
        answer = by_id[r["positives"][0]].title
        assert r["answers"] == [answer] and r["question"].startswith(PREFIX)
        assert answer.lower() not in r["question"].lower()
    with pytest.raises(ValueError, match="n_test"):
        dictionary_questions(n_passages=9, n_test=50, min_swapped=1, entries=ENTRIES)


@pytest.mark.slow  # ~15 s: parses the whole dictionary and indexes 10,000 entries
@requires.dictionary("gcide")
def test_on_the_real_dictionary_bm25_alone_misses_some():
    from lmforge.retrieval.bm25 import BM25Index
    from lmforge.retrieval.evaluate import bm25_rankings, recall_at_k

    passages, sets = dictionary_questions()
    recall = recall_at_k(bm25_rankings(BM25Index.build(passages), passages, sets["test"], 20), sets["test"])
    assert 0.3 < recall["recall@20"] < 0.95
