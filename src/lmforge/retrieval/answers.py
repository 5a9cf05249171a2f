"""Whether a passage holds an answer, as DPR decides it (Karpukhin et al. 2020; its qa_validation.has_answer,
"string" match): the answer's words, a run of the passage's, after NFD normalisation and lower-casing, in the
words of its SimpleTokenizer. DPR's top-k accuracy (evaluate.py) and its hard negatives (bm25.py) use it.
`whole_words` is a whole-word rule over characters, near has_answer's but keeping character offsets: the
reader's gold spans and negatives (reader.py) and REALM's answer recall (realm.py) use it.
"""
from __future__ import annotations

import functools
import re
import unicodedata

WORD_CHAR = r"[^\W_]"  # a letter or digit (\w less "_"): what an answer occurrence may not touch


def answer_words(text: str) -> list:
    """DPR's SimpleTokenizer words of NFD-normalised `text`, lower-cased: runs of letters, digits and marks,
    and each other character that is not a separator or a control character, alone."""
    return list(_words(text))


@functools.lru_cache(maxsize=8192)  # a passage is matched against many questions (top k, hard negatives)
def _words(text: str) -> tuple:
    words, run = [], []
    for char in unicodedata.normalize("NFD", text):
        kind = unicodedata.category(char)[0]
        if kind in "LNM":
            run.append(char)
            continue
        if run:
            words.append("".join(run))
            run = []
        if kind not in "ZC":
            words.append(char)
    return tuple(w.lower() for w in words + (["".join(run)] if run else []))


def has_answer(answers: list, text: str) -> bool:
    """Whether one of `answers` occurs in `text` as a run of whole words (DPR's has_answer, "string" match:
    "Paris" is in "Paris, France" but not in "Parisian")."""
    words = _words(text)
    for answer in answers:
        want = _words(answer)
        if want and any(words[i:i + len(want)] == want for i in range(len(words) - len(want) + 1)):
            return True
    return False


def whole_words(answer: str) -> str:
    """A regular expression for `answer` as whole words: an occurrence neither preceded nor followed by a
    letter or digit ("Rome" in "(Rome)" and "Rome," but not in "Romeo"; "1" not in "1990")."""
    return rf"(?<!{WORD_CHAR}){re.escape(answer)}(?!{WORD_CHAR})"
