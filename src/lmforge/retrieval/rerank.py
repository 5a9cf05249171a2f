"""A cross-encoder over a retriever's top k (retrieve, then rerank; Nogueira & Cho 2019): training records
from a retriever's negatives, and rankings re-ordered by a reranker (pipelines/rerank.py).

The reranker reads each passage as the dense encoder does (dpr.passage_text: title, then text).
"""
from __future__ import annotations

from lmforge.pipelines.rerank import Reranker, order
from lmforge.retrieval.answers import has_answer
from lmforge.retrieval.dpr import passage_text


def rerank_training_records(records: list, passages: list, rankings: list, n_negatives: int) -> list:
    """Rerank task records (query, positive, negatives): each question's first positive passage and the
    first `n_negatives` retrieved passages that are neither a positive nor hold an answer, in any case (the
    retriever's hard negatives); questions with no such negative are left out."""
    by_id = {p.id: p for p in passages}
    out = []
    for r, ranked in zip(records, rankings):
        positives = set(r["positives"])
        answers = [a for a in r.get("answers", ()) if a]  # as bm25.hard_negatives: DPR's whole-word rule
        negatives = [passage_text(by_id[i]) for i in ranked if i not in positives
                     and not has_answer(answers, by_id[i].text)][:n_negatives]
        if negatives and r["positives"][0] in by_id:
            out.append({"query": r["question"], "positive": passage_text(by_id[r["positives"][0]]),
                        "negatives": negatives})
    return out


def rerank_ids(reranker: Reranker, query: str, ids: list, by_id: dict, batch_size: int = 64) -> tuple:
    """(ids best first by the reranker, their relevance scores) of one query's retrieved passage ids."""
    logits = reranker.task.pair_scores(query, [passage_text(by_id[i]) for i in ids], batch_size)
    best = order(logits)
    return [ids[i] for i in best], [reranker.score(logits[i]) for i in best]


def reranked_rankings(model, records: list, passages: list, rankings: list, batch_size: int = 64) -> list:
    """Each question's retrieved ids re-ordered by the reranker `model` (a directory or a Reranker)."""
    reranker, by_id = Reranker.load(model), {p.id: p for p in passages}
    return [rerank_ids(reranker, r["question"], ranked, by_id, batch_size)[0]
            for r, ranked in zip(records, rankings)]
