"""The sparse baseline: BM25 (Robertson & Zaragoza 2009) over passages, from the maintained `bm25s`
library (Lù 2024), and the BM25 hard negatives DPR trains with (Karpukhin et al. 2020, sec. 3.2:
top BM25 passages that do not hold the answer).

Saved by bm25s as .npy arrays (written and read with allow_pickle=False) and JSON.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from lmforge.utils.atomic import atomic_write_text, replace_dir

STOPWORDS = "en"


def _tokens(texts: list) -> list:
    import bm25s

    return bm25s.tokenize(texts, stopwords=STOPWORDS, return_ids=False, show_progress=False)


class BM25Index:
    """BM25 scores of the passages (title + text) for a query; search returns passage positions."""

    def __init__(self, retriever, n_passages: int) -> None:
        self.retriever, self.n = retriever, n_passages

    @classmethod
    def build(cls, passages: list, k1: float = 1.5, b: float = 0.75) -> "BM25Index":
        """Index `passages` (Lucene's BM25 variant, bm25s's default)."""
        import bm25s

        retriever = bm25s.BM25(k1=k1, b=b)
        retriever.index(_tokens([f"{p.title} {p.text}" for p in passages]), show_progress=False)
        return cls(retriever, len(passages))

    def search(self, queries: list, k: int) -> tuple:
        """((Q, k) passage positions, (Q, k) scores), best first; a query with no known word scores
        every passage 0 (its ranking is then arbitrary)."""
        k = min(k, self.n)
        tokens = [t or ["\0"] for t in _tokens(list(queries))]  # bm25s refuses an empty query
        positions, scores = self.retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return np.asarray(positions), np.asarray(scores)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the index under `path` (bm25s's .npy and JSON files; no pickle), replacing it whole."""

        def write(folder: Path) -> None:  # bm25s writes with plain open(): into a fresh folder only
            self.retriever.save(str(folder), allow_pickle=False, show_progress=False)
            atomic_write_text(folder / "count.txt", str(self.n))

        replace_dir(path, write)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "BM25Index":
        """Read an index written by save(); a missing or damaged one is a one-line ValueError."""
        import bm25s

        path = Path(path)
        try:
            n = int((path / "count.txt").read_text())
            retriever = bm25s.BM25.load(str(path), allow_pickle=False, show_progress=False)
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"{path}: not a readable BM25 index ({type(err).__name__}: {err})") from None
        return cls(retriever, n)


def hard_negatives(index: BM25Index, records: list, passages: list, n: int = 1, depth: int = 20) -> list:
    """Per question record, the ids of up to `n` top BM25 passages that are not positives and do not
    contain an answer string (DPR's hard negatives)."""
    positions, _ = index.search([r["question"] for r in records], depth)
    out = []
    for r, row in zip(records, positions):
        negatives = []
        for i in row:
            p = passages[int(i)]
            if p.id not in r["positives"] and not any(a and a in p.text for a in r["answers"]):
                negatives.append(p.id)
            if len(negatives) == n:
                break
        out.append(negatives)
    return out
