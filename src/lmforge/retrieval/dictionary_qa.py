"""Question / answer pairs where word overlap is not enough: a reverse dictionary built from the
Collaborative International Dictionary of English (Debian's dict-gcide; lmforge.data.dictionary
reads it and names the package when it is missing).

Each passage is one dictionary entry: the headword as title, its first definition as text. A
question restates a definition in other words, taken from other entries of the dictionary: every
content word w of the definition that has a one-word synonym s (a one-word gloss of w's own entry,
"Wayfaring: Traveling; passing; ...", or the headword of an entry that glosses w) is replaced by s,
with probability `swap`; parenthesised labels and scientific names are dropped. The answer is the
headword. So the fact (what the word means) is stated in one document and asked about with the
words of others: BM25 sees only the words left over, while a retriever that knows synonyms can
still match the question to the passage that answers it.

    "Which word means: one who journeys; a wayfarer; a passenger?"  ->  Traveler
"""
from __future__ import annotations

import random
import re

from lmforge.data.dictionary import definitions
from lmforge.retrieval.passages import Passage

# never swapped: function words (bm25s's English list and more) and the dictionary's own frame words
# ("the act of ...", "the state of being ..."), whose one-word glosses are rare senses (act -> histrionize)
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with who which what whom one any some its from than so being act state quality "
    "condition out upon up made make used use especially esp etc also other hence having like more most very "
    "much many same all each every pertaining relating kind form manner way part thing see".split())
_WORD = re.compile(r"[A-Za-z][a-z]+(?:-[a-z]+)?")
_PARENS = re.compile(r"\([^()]*\)|\[[^\[\]]*\]|\s--\s.*$")  # labels, etymologies, derived forms
PREFIX = "Which word means: "


def _glosses(sense: str) -> list:
    """The one-word glosses of a definition ("Traveling; passing; being on a journey." -> traveling,
    passing), lower-cased; a leading "to" of a verb's gloss or an article is dropped."""
    out = []
    for part in re.split(r"[;.]", _PARENS.sub("", sense)):
        words = part.split()
        if words[:1] and words[0].lower() in ("to", "a", "an", "the"):
            words = words[1:]
        if len(words) == 1 and _WORD.fullmatch(words[0]):
            out.append(words[0].lower())
    return out


def synonyms(entries: list) -> dict:
    """{word: one-word synonyms, the most common in the dictionary's definitions first}: each
    headword's one-word glosses, and back (a gloss gets the headword), neither a stopword nor the
    word itself."""
    counts: dict = {}
    for _, _, sense in entries:
        for w in _WORD.findall(sense.lower()):
            counts[w] = counts.get(w, 0) + 1
    table: dict = {}
    for word, _, sense in entries:
        head = word.lower()
        if not _WORD.fullmatch(word) or head in STOPWORDS:
            continue
        for gloss in _glosses(sense):
            if gloss != head and gloss not in STOPWORDS:
                table.setdefault(head, set()).add(gloss)
                table.setdefault(gloss, set()).add(head)
    return {w: sorted(s, key=lambda x: (-counts.get(x, 0), x)) for w, s in table.items()}


def _related(a: str, b: str) -> bool:
    """Words that share a stem-like prefix (travels / traveler): such a swap would keep the overlap."""
    n = min(5, len(a), len(b))
    return a[:n] == b[:n]


def paraphrase(sense: str, answer: str, table: dict, rng: random.Random, swap: float = 1.0,
               max_words: int = 30) -> tuple:
    """(the definition in other words, words swapped, content words kept): each content word goes to
    its most common synonym with probability `swap`, never to the answer, a word related to it, or a
    word related to the one it replaces."""
    text = " ".join(_PARENS.sub("", sense).split()[:max_words])
    answer, counts = answer.lower(), {"swapped": 0, "kept": 0}

    def swap_word(match) -> str:
        word = match.group(0)
        if word.lower() in STOPWORDS or len(word) < 3:
            return word
        options = [s for s in table.get(word.lower(), ()) if not _related(s, word.lower()) and not
                   _related(s, answer)]
        if not options or rng.random() >= swap:
            counts["kept"] += 1
            return word
        counts["swapped"] += 1
        return options[0]

    return _WORD.sub(swap_word, text).strip(" ;,."), counts["swapped"], counts["kept"]


def dictionary_questions(n_passages: int = 10_000, n_test: int = 500, seed: int = 0, swap: float = 1.0,
                         min_swapped: int = 2, entries: list | None = None) -> tuple:
    """(passages, {"train", "test"} question records): `n_passages` seeded dictionary entries (one
    per headword), and a question for each entry whose paraphrase swapped at least `min_swapped`
    words and kept no more content words than it swapped; the last `n_test` questions (by a seeded
    shuffle) are the test set."""
    entries = definitions() if entries is None else entries
    table, rng = synonyms(entries), random.Random(seed)
    seen, unique = set(), []
    for word, _, sense in entries:
        if word.lower() not in seen and len(sense.split()) <= 80:
            seen.add(word.lower())
            unique.append((word, sense))
    rng.shuffle(unique)
    passages = [Passage(str(i), word, sense) for i, (word, sense) in enumerate(unique[:n_passages])]
    records = []
    for p in passages:
        question, swapped, kept = paraphrase(p.text, p.title, table, rng, swap)
        if swapped >= max(min_swapped, kept):
            records.append({"question": f"{PREFIX}{question}?", "answers": [p.title], "positives": [p.id]})
    if len(records) <= n_test:
        raise ValueError(f"only {len(records)} dictionary questions from {len(passages)} passages; "
                         f"n_test={n_test} leaves none to train on")
    return passages, {"train": records[:-n_test], "test": records[-n_test:]}
