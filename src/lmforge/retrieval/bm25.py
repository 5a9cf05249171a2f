"""The sparse baseline: BM25 (Robertson & Zaragoza 2009) over passages, from the maintained `bm25s`
library (Lù 2024), and the BM25 hard negatives DPR trains with (Karpukhin et al. 2020, sec. 3.2:
top BM25 passages that do not hold the answer).

Saved by bm25s as .npy arrays (written and read with allow_pickle=False) and JSON, beside a
manifest.json written last: the passage count and the sha256 of every file, checked on load, so a
damaged, changed or half-written index is refused naming the file. The vocabulary is numbered in
sorted order (bm25s numbers words as a set yields them, which follows Python's hash seed), so the
same passages give the same files byte for byte.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from lmforge.retrieval.answers import has_answer
from lmforge.retrieval.index import top_k
from lmforge.retrieval.index_dir import IndexDamaged, read_manifest
from lmforge.utils.atomic import atomic_write_text, replace_dir
from lmforge.utils.checksum import check_files, sha256

STOPWORDS = "en"
FORMAT = "lmforge-bm25-index"
MANIFEST = "manifest.json"
# what bm25s reads back (params.index.json says whether it reads more): each must be in the manifest
FILES = ("data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy", "vocab.index.json",
         "params.index.json")


def _tokens(texts: list) -> list:
    import bm25s

    return bm25s.tokenize(texts, stopwords=STOPWORDS, return_ids=False, show_progress=False)


def _numbered(documents: list, passages: list, where: str) -> tuple:
    """(word ids per document, {word: id} in sorted order); a ValueError naming `where` and a passage
    when no passage has a word to index (BM25 has nothing to score: bm25s fails on it)."""
    vocabulary = {word: i for i, word in enumerate(sorted({w for doc in documents for w in doc}))}
    if not vocabulary:
        shown = ", ".join(repr(p.id) for p in passages[:3]) + (", ..." if len(passages) > 3 else "")
        raise ValueError(f"{where}: no passage has a word BM25 can index (passage {shown}: only stopwords "
                         f"and one-letter words, or none)")
    return [[vocabulary[w] for w in doc] for doc in documents], vocabulary


class BM25Index:
    """BM25 scores of the passages (title + text) for a query; search returns passage positions."""

    def __init__(self, retriever, n_passages: int) -> None:
        self.retriever, self.n = retriever, n_passages

    @classmethod
    def build(cls, passages: list, k1: float = 1.5, b: float = 0.75, where: str = "passages") -> "BM25Index":
        """Index `passages` (Lucene's BM25 variant, bm25s's default); a passage with no word to index is
        an empty document (it scores 0); passages (`where`, for the error) with none at all are refused."""
        import bm25s

        documents = _tokens([f"{p.title} {p.text}" for p in passages])
        retriever = bm25s.BM25(k1=k1, b=b)
        retriever.index(_numbered(documents, passages, where), show_progress=False)
        return cls(retriever, len(passages))

    def search(self, queries: list, k: int) -> tuple:
        """((Q, k) passage positions, (Q, k) scores), best first, ties to the lower position (index.top_k,
        as the dense search); the scores are bm25s's own. A query with no known word scores every passage
        0 (the first k are then returned)."""
        k, vocabulary, queries = min(k, self.n), self.retriever.vocab_dict, list(queries)
        positions, scores = np.zeros((len(queries), k), np.int64), np.zeros((len(queries), k), np.float32)
        for row, words in enumerate(_tokens(queries)):  # one (N,) score vector held at a time
            ids = [vocabulary[w] for w in words if w in vocabulary]
            # bm25s's own top k (argpartition, then an unstable argsort; jax's top_k where jax is installed)
            # orders tied passages its own way: duplicates would rank otherwise than in the dense search
            every = self.retriever.get_scores(ids) if ids else np.zeros(self.n, dtype=np.float32)
            values, at = top_k(torch.from_numpy(np.asarray(every, dtype=np.float32))[None], k)
            positions[row], scores[row] = at[0].numpy(), values[0].numpy()
        return positions, scores

    def save(self, path: str | os.PathLike) -> Path:
        """Write the index under `path` (bm25s's .npy and JSON files; no pickle) with its manifest,
        replacing it whole."""

        def write(folder: Path) -> None:  # bm25s writes with plain open(): into a fresh folder only
            self.retriever.save(str(folder), allow_pickle=False, show_progress=False)
            files = sorted(p.name for p in folder.iterdir() if p.is_file())
            manifest = {"format": FORMAT, "version": 1, "count": self.n,
                        "sha256": {name: sha256(folder / name) for name in files}}
            atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=2) + "\n")

        replace_dir(path, write)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "BM25Index":
        """Read an index written by save(), every file checked against its manifest; a missing, damaged
        or changed one is a one-line ValueError naming the file."""
        import bm25s

        path = Path(path)
        manifest = _manifest(path)
        try:
            retriever = bm25s.BM25.load(str(path), allow_pickle=False, show_progress=False, load_corpus=False)
        except (OSError, ValueError, KeyError) as err:  # checksums matched: a file bm25s itself cannot read
            raise IndexDamaged(f"{path}: not a readable BM25 index ({type(err).__name__}: {err})") from None
        if retriever.scores.get("num_docs") != manifest["count"]:
            raise IndexDamaged(f"{path / MANIFEST}: count {manifest['count']} is not the index's "
                               f"{retriever.scores.get('num_docs')} passages")
        return cls(retriever, manifest["count"])


def _manifest(path: Path) -> dict:
    """The manifest of a BM25 index folder, each file it lists present and matching its checksum."""
    file = path / MANIFEST
    manifest = read_manifest(file, FORMAT, "an lmforge BM25 index manifest")
    sums = manifest.get("sha256")
    if not isinstance(sums, dict) or not sums:
        raise IndexDamaged(f"{file}: not an lmforge BM25 index manifest")
    unlisted = [name for name in FILES if name not in sums]
    if unlisted:
        raise IndexDamaged(f"{file}: lists no checksum of {', '.join(unlisted)}")
    check_files(path, sums, file, IndexDamaged)
    return manifest


def negatives_depth(n: int, depth: int = 20) -> int:
    """How deep to search for `n` negatives: at least `depth`, and 2n (a search shallower could hold fewer
    than n passages without an answer, and a question short of them would be left out)."""
    return max(depth, 2 * n)


def hard_negatives(index: BM25Index, records: list, passages: list, n: int = 1, depth: int = 20) -> list:
    """Per question record, the ids of up to `n` top BM25 passages that are not positives and do not
    contain an answer as DPR's has_answer finds it (answers.has_answer: its words, NFD-normalised, in any
    case and spacing; "Rome" is not in "Romeo"), from its top max(depth, 2n)."""
    positions, _ = index.search([r["question"] for r in records], negatives_depth(n, depth))
    out = []
    for r, row in zip(records, positions):
        negatives, answers = [], [a for a in r["answers"] if a]
        for i in row:
            p = passages[int(i)]
            # "Paris" in "PARIS is ...", "Jean-Paul" in "Jean - Paul", "Café" in NFD form hold the answer:
            # as a negative it would teach the retriever against it; "Romeo" does not hold "Rome" (a negative)
            if p.id not in r["positives"] and not has_answer(answers, p.text):
                negatives.append(p.id)
            if len(negatives) == n:
                break
        out.append(negatives)
    return out
