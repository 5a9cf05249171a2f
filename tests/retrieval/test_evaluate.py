"""DPR's top-k retrieval accuracy: an answer string among the words of a retrieved passage's text (not its
title), beside recall@k of the labelled positives; a comparison builds the passages' texts once."""
from lmforge.retrieval import evaluate
from lmforge.retrieval.evaluate import answer_accuracy_at_k, retrieval_metrics
from lmforge.retrieval.passages import Passage


def test_accuracy_at_k_counts_an_answer_in_the_first_k_passages_texts_not_positives_nor_titles():
    passages = [Passage("a", "Paris", "no answer"), Passage("b", "t", "It is Paris."),
                Passage("c", "t", "none")]
    records = [{"question": "q", "answers": ["Paris"], "positives": ["c"]},
               {"question": "q", "answers": ["Rome"], "positives": ["a"]}]
    rankings = [["a", "b", "c"], ["a", "b", "c"]]
    assert answer_accuracy_at_k(rankings, records, passages, (1, 2)) == {"accuracy@1": 0.0, "accuracy@2": 0.5}
    # retrieval_metrics leaves accuracy out where a record's positives never hold its answer: it would be 0
    # at any rank (the built-in dictionary questions, whose answer is the headword a definition leaves out)
    assert retrieval_metrics(rankings, records, passages, (1, 3)) == {"recall@1": 0.5, "recall@3": 1.0}
    passages[2] = Passage("c", "t", "Rome is in Italy, Paris in France.")
    passages[0] = Passage("a", "Paris", "It is Rome.")
    table = retrieval_metrics(rankings, records, passages, (1, 3))
    assert table == {"recall@1": 0.5, "recall@3": 1.0, "accuracy@1": 0.5, "accuracy@3": 1.0}


def test_accuracy_is_kept_where_some_records_have_no_answer_in_their_positive():
    """One record without answers (or a gold passage not holding it, as real NQ has) had dropped the
    metric for the whole set."""
    passages = [Passage("a", "t", "It is Paris."), Passage("b", "t", "none")]
    records = [{"question": "q", "answers": ["Paris"], "positives": ["a"]},
               {"question": "q", "answers": [], "positives": ["b"]}]
    table = retrieval_metrics([["a", "b"], ["a", "b"]], records, passages, (1,))
    assert table == {"recall@1": 0.5, "accuracy@1": 0.5}


def test_a_comparison_builds_the_passage_texts_once_for_every_table(monkeypatch):
    passages = [Passage("a", "t", "It is Paris."), Passage("b", "t", "Rome is old."),
                Passage("c", "t", "none")]
    records = [{"question": "where is Paris", "answers": ["Paris"], "positives": ["a"]},
               {"question": "old Rome", "answers": ["Rome"], "positives": ["b"]}]
    dense = {"one": [["c", "a", "b"], ["c", "b", "a"]], "two": [["b", "c", "a"], ["a", "c", "b"]]}
    built = []
    monkeypatch.setattr(evaluate, "passage_texts", lambda ps: built.append(1) or {p.id: p.text for p in ps})
    monkeypatch.setattr(evaluate, "encode_passages", lambda encoder, passages, path: encoder)
    monkeypatch.setattr(evaluate, "dense_rankings", lambda encoder, index, records, k: dense[index])
    table = evaluate.compare(passages, records, {"one": "one", "two": "two"}, "unused", k=3)
    assert len(built) == 1 and list(table) == ["bm25", "one", "two"]
    assert table["one"] == {"recall@1": 0.0, "recall@5": 1.0, "recall@20": 1.0,
                            "accuracy@1": 0.0, "accuracy@5": 1.0, "accuracy@20": 1.0}
    assert table["two"]["recall@1"] == table["two"]["accuracy@1"] == 0.0
