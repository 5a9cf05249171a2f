"""Salient span masking (Guu et al. 2020, sec. 3.4): REALM masks a named entity or a date of the
input rather than random tokens, since those are the spans whose filling needs world knowledge.

The paper finds the spans with a BERT-based tagger trained on CoNLL-2003 and a date regex. Without a
tagger here, names are runs of capitalised words (a sentence's first word counts unless it is a
function word such as "The" or "She"; leading function words are dropped: "The Nile" gives "Nile"),
and dates are years (1000-2099), optionally after a month and a day ("May 5, 1990"). Built-in
passages name their people, cities and countries this way; on other text the heuristic also picks
up capitalised common words, as a tagger's false positives would.
"""
from __future__ import annotations

import random
import re

from lmforge.objectives.base import IGNORE

MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December")
_DATE = re.compile(rf"\b(?:(?:{MONTHS})\s+(?:\d{{1,2}},?\s+)?)?(?:1\d{{3}}|20\d{{2}})\b")
_NAME = re.compile(r"\b[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*")
FUNCTION_WORDS = frozenset(
    "A An The It Its He She His Her Him They Their Them We Our I My You Your This That These Those There "
    "Here In On At Of For From With By To As And But Or If When While After Before Since What Which Who "
    "Whom Whose Where Why How Some Many Most All Each Every No Not Yes".split())


def salient_spans(text: str) -> list:
    """(start, end) character spans of the dates and names in `text`, in order, never overlapping."""
    spans = [m.span() for m in _DATE.finditer(text)]
    for m in _NAME.finditer(text):
        start, words = m.start(), m.group().split()
        while words and words[0] in FUNCTION_WORDS:  # "The Nile" -> "Nile"; "She" -> nothing
            start = text.index(words[1], start + len(words[0])) if len(words) > 1 else m.end()
            words = words[1:]
        if words and not any(a < m.end() and start < b for a, b in spans):
            spans.append((start, m.end()))
    return sorted(spans)


def mask_span(encoding, text: str, span: tuple, mask_id: int, max_tokens: int) -> dict | None:
    """x with every occurrence of the span's text masked: {"x": ids (no specials, [MASK] there),
    "labels": the original ids there and IGNORE elsewhere}; None when no masked token is left within
    the first `max_tokens` tokens (`encoding` is the tokenizer's encoding of `text`, with offsets)."""
    answer = text[span[0]:span[1]]
    where = [(m.start(), m.end()) for m in re.finditer(rf"(?<!\w){re.escape(answer)}(?!\w)", text)]
    ids, labels = [], []
    for token, (a, b) in zip(encoding.ids[:max_tokens], encoding.offsets[:max_tokens]):
        hit = b > a and any(a < e and s < b for s, e in where)
        ids.append(mask_id if hit else token)
        labels.append(token if hit else IGNORE)
    if all(label == IGNORE for label in labels):
        return None
    return {"x": ids, "labels": labels}


def span_examples(tokenizer, passages: list, rows: list, max_tokens: int = 64, per_passage: int = 0,
                  seed: int = 0) -> list:
    """Salient-span examples of the passages at `rows`: {"x", "labels", "source" (the passage's row),
    "answer" (the span's text)}; every span of each passage (or `per_passage` of them, drawn seeded)."""
    mask_id = tokenizer.special_id("mask")
    if mask_id is None:
        raise ValueError("salient span masking needs a tokenizer with a [MASK] token")
    rng, out = random.Random(seed), []
    for row in rows:
        text = passages[row].text
        spans = salient_spans(text)
        if per_passage and len(spans) > per_passage:
            spans = sorted(rng.sample(spans, per_passage))
        encoding = tokenizer.encode(text, add_special_tokens=False)
        for span in spans:
            example = mask_span(encoding, text, span, mask_id, max_tokens)
            if example is not None:
                out.append({**example, "source": row, "answer": text[span[0]:span[1]]})
    return out
