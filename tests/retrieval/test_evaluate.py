"""DPR's top-k retrieval accuracy: an answer string among the words of a retrieved passage's text, as DPR's
has_answer ("string" match) finds it."""
import pytest

from lmforge.retrieval.evaluate import answer_accuracy_at_k, answer_words, has_answer, retrieval_metrics
from lmforge.retrieval.passages import Passage

TEXTS = ["Paris, France's capital.", "Café au lait", "Cafe\u0301 AU\tlait!", "Parisian  life (1920s)",
         "Ünïcode: naïve résumé — x2 e=mc²", "line\nbreak\u00a0nbsp", ""]


@pytest.mark.parametrize("text", TEXTS)
def test_answer_words_are_dpr_simple_tokenizers_words(text):
    regex = pytest.importorskip("regex")  # DPR's SimpleTokenizer is written with the regex package
    import unicodedata

    pattern = regex.compile(r"([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])",
                            flags=regex.IGNORECASE + regex.UNICODE + regex.MULTILINE)
    want = [m.group().lower() for m in pattern.finditer(unicodedata.normalize("NFD", text))]
    assert answer_words(text) == want


def test_an_answer_matches_whole_words_in_any_case_and_unicode_form():
    assert has_answer(["paris"], "PARIS, France") and has_answer(["Café"], "cafe\u0301 au lait")
    assert not has_answer(["Paris"], "Parisian life") and not has_answer(["", "x"], "a y")


def test_accuracy_at_k_counts_an_answer_in_the_first_k_passages_texts_not_positives_nor_titles():
    passages = [Passage("a", "Paris", "no answer"), Passage("b", "t", "It is Paris."), Passage("c", "t", "none")]
    records = [{"question": "q", "answers": ["Paris"], "positives": ["c"]},
               {"question": "q", "answers": ["Rome"], "positives": ["a"]}]
    rankings = [["a", "b", "c"], ["a", "b", "c"]]
    assert answer_accuracy_at_k(rankings, records, passages, (1, 2)) == {"accuracy@1": 0.0, "accuracy@2": 0.5}
    table = retrieval_metrics(rankings, records, passages, (1, 3))
    assert table == {"recall@1": 0.5, "recall@3": 1.0, "accuracy@1": 0.0, "accuracy@3": 0.5}
