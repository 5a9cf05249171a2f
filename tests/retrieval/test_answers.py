"""A passage holds an answer as DPR's has_answer ("string" match) decides: the answer's words among its
SimpleTokenizer words, NFD-normalised and lower-cased."""
import pytest

from lmforge.retrieval.answers import answer_words, has_answer

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
