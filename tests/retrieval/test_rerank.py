"""Rerank training records from a retriever's rankings: the hard negatives hold no answer."""
from lmforge.retrieval.passages import Passage
from lmforge.retrieval.rerank import rerank_training_records


def test_a_passage_holding_the_answer_in_another_case_is_no_rerank_negative():
    passages = [Passage("0", "Mupi", "Mupi lies on the Rhine."), Passage("1", "Lore", "RHINE tales of Mupi."),
                Passage("2", "Other", "Mupi has a small market.")]
    records = [{"question": "Which river flows through Mupi?", "answers": ["Rhine"], "positives": ["0"]}]
    out = rerank_training_records(records, passages, [["1", "0", "2"]], n_negatives=2)
    assert out[0]["negatives"] == ["Other. Mupi has a small market."]


def test_an_answer_inside_a_longer_word_leaves_a_passage_a_negative():
    """The substring rule took 'Romeo' as holding the answer 'Rome' and dropped a real negative; the
    whole-word rule of DPR's has_answer (bm25.hard_negatives' too) keeps it."""
    passages = [Passage("0", "City", "Rome is the capital."), Passage("1", "Play", "Romeo loved Juliet."),
                Passage("2", "Map", "The road to ROME, and on.")]
    records = [{"question": "What is the capital?", "answers": ["Rome"], "positives": ["0"]}]
    out = rerank_training_records(records, passages, [["1", "2", "0"]], n_negatives=2)
    assert out[0]["negatives"] == ["Play. Romeo loved Juliet."]
