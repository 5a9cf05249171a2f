"""The jobs behind `lmforge index build` and `lmforge retrieve`: an index directory (passages, BM25,
optionally dense), queries against it, and a DPR training run with its recall table.

An index directory holds passages.jsonl, bm25/ (bm25s files) and, with a model, dense/ (see
index.py; its manifest names the model that embeds the queries).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from lmforge.retrieval.bm25 import BM25Index
from lmforge.retrieval.dpr import BiEncoder
from lmforge.retrieval.evaluate import compare, encode_passages, train_dpr, write_table
from lmforge.retrieval.index import DenseIndex
from lmforge.retrieval.passages import load_passages, read_passages, write_passages
from lmforge.retrieval.questions import builtin_questions, check_positives, read_questions

METHODS = ("dense", "bm25")


def build_index_dir(out, source: str | None, model: str | None = None, seed: int = 0, words: int = 100,
                    batch_size: int = 64, progress: bool = True, **options) -> dict:
    """Passages from `source` into out/passages.jsonl, out/bm25/, and with `model` out/dense/;
    returns counts for the summary line."""
    out = Path(out)
    passages = load_passages(source, seed, words)
    write_passages(passages, out / "passages.jsonl")
    BM25Index.build(passages).save(out / "bm25")
    summary = {"passages": len(passages), "bm25": str(out / "bm25")}
    if model:
        encoder = BiEncoder.from_dir(model, **options)
        name = str(Path(model).resolve()) if Path(model).is_dir() else str(model)
        index = encode_passages(encoder, passages, out / "dense", batch_size, progress, model_name=name)
        summary.update(dense=str(out / "dense"), dim=index.dim)
    return summary


def query_index(path, queries: list, k: int = 5, method: str = "dense", model: str | None = None,
                backend: str = "torch") -> list:
    """[{"query", "results": [{"rank", "id", "title", "score", "text"}]}] for each query."""
    path = Path(path)
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")
    passages = read_passages(path / "passages.jsonl")
    if method == "bm25":
        positions, scores = BM25Index.load(path / "bm25").search(queries, k)
    else:
        if not (path / "dense").is_dir():
            raise ValueError(f"{path}: no dense index (build it with --model, or query with --method bm25)")
        index = DenseIndex.load(path / "dense")
        encoder = BiEncoder.from_dir(model or index.manifest.get("model") or "")
        scores, positions = index.search(encoder.encode(queries), k, backend=backend)
        positions, scores = positions.numpy(), scores.numpy()
    return [{"query": q, "results": [{"rank": r + 1, "id": passages[int(i)].id, "title": passages[int(i)].title,
                                      "score": round(float(s), 4), "text": passages[int(i)].text}
                                     for r, (i, s) in enumerate(zip(row, srow))]}
            for q, row, srow in zip(queries, positions, scores)]


def question_sets(questions: str | None, passages_source: str | None, seed: int) -> tuple:
    """(passages, {"train", "test"} records): built-in, or a user's QA file split 90/10 (seeded)."""
    if questions in (None, "builtin"):
        passages = load_passages(passages_source, seed)
        sets = builtin_questions(passages, seed)
        return passages, {"train": sets["train"], "test": sets["test"]}
    records, passages = read_questions(questions)
    if passages_source:
        passages = load_passages(passages_source, seed)
    check_positives(records, passages, questions)
    records = list(records)
    random.Random(seed).shuffle(records)
    cut = max(1, int(0.9 * len(records)))
    if cut >= len(records):
        raise ValueError(f"{questions}: {len(records)} question(s) are too few to hold some out for the test")
    return passages, {"train": records[:cut], "test": records[cut:]}


def run_train(model: str, out, cfg, questions: str | None = None, passages_source: str | None = None,
              n_hard: int = 1, resume: bool = False, log=print, **options) -> dict:
    """Train DPR from `model` on the training questions, then recall@k on the held-out ones for BM25,
    the untrained and the trained encoder; written to out/recall.json and returned."""
    out = Path(out)
    passages, sets = question_sets(questions, passages_source, cfg.seed)
    trained = train_dpr(BiEncoder.from_dir(model, **options), sets["train"], passages, out, cfg, n_hard,
                        resume, log)
    table = compare(passages, sets["test"], {"untrained": BiEncoder.from_dir(model, **options),
                                             "trained": trained}, out / "eval")
    write_table(table, out / "recall.json")
    (out / "eval" / "questions.json").write_text(json.dumps({"train": len(sets["train"]), "test": len(sets["test"]),
                                                             "passages": len(passages)}))
    return table
