"""The Inverse Cloze Task (Lee et al. 2019, sec. 4), REALM's warm start for Embed_input and Embed_doc
(Guu et al. 2020, sec. 3.4): a sentence drawn from a passage is the pseudo-question, the passage with
that sentence taken out is its positive, and the other passages of the batch are the negatives; so
the retriever learns to find the context a sentence came from before any question exists.

The sentence stays in its passage with probability `keep` (0.1 in the paper: some word matching is
useful, too much makes the task lexical). Trained with DPR's objective (in-batch negatives, no hard
ones) on the one trainer.
"""
from __future__ import annotations

import random
import re

from lmforge.retrieval.dpr import BiEncoder

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list:
    """`text` split after '.', '!' or '?' followed by white space."""
    return [s for s in _SENTENCE_END.split(text.strip()) if s]


def ict_pair(title: str, text: str, rng: random.Random, keep: float = 0.1) -> tuple | None:
    """(pseudo-question, context) from one passage, or None when it has fewer than two sentences:
    a random sentence, and "title. text" with that sentence removed (left in with probability keep)."""
    parts = sentences(text)
    if len(parts) < 2:
        return None
    i = rng.randrange(len(parts))
    rest = parts if rng.random() < keep else parts[:i] + parts[i + 1:]
    return parts[i], f"{title}. {' '.join(rest)}"


def ict_examples(encoder: BiEncoder, passages: list, seed: int = 0, keep: float = 0.1,
                 rounds: int = 1) -> list:
    """DPRObjective examples ({"question", "positive", "negatives": []} token ids, and the passage's row as
    their keys) of `rounds` ICT pairs per passage with two sentences or more, drawn with `seed`."""
    if not 0 <= keep <= 1 or rounds < 1:
        raise ValueError(f"need 0 <= keep <= 1 and rounds >= 1, got keep={keep}, rounds={rounds}")
    rng, out = random.Random(seed), []
    for _ in range(rounds):
        for row, p in enumerate(passages):
            pair = ict_pair(p.title, p.text, rng, keep)
            if pair is not None:  # keys: another round's context of this passage holds the question too
                out.append({"question": encoder.ids(pair[0]), "positive": encoder.ids(pair[1]),
                            "negatives": [], "keys": [row], "positive_keys": [row]})
    if not out:
        raise ValueError("no passage has two sentences: the inverse cloze task needs one to take out")
    return out
