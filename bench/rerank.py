"""A cross-encoder reranker over a retriever's top 20 on the dictionary questions (lmforge.retrieval.dictionary_qa:
GCIDE definitions restated with other entries' words; 10,000 entries as passages, 500 held-out questions).

The reranker is fine-tuned from all-MiniLM-L6-v2 (`lmforge finetune --task rerank`'s job: one output over
[CLS] question [SEP] title. definition [SEP]) on training questions, each with its positive and the
retriever's first hard negatives (listwise softmax loss), on one thread. The held-out questions' top 20
from the retriever are then re-ordered by it: recall@1, recall@5 and MRR@10 before and after.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.rerank [--retriever bm25|dense] [--steps 300]
writes bench/results/rerank.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from lmforge.retrieval.bm25 import BM25Index
from lmforge.retrieval.dictionary_qa import dictionary_questions
from lmforge.retrieval.dpr import BiEncoder
from lmforge.retrieval.evaluate import bm25_rankings, dense_rankings, encode_passages, mean_reciprocal_rank, recall_at_k
from lmforge.retrieval.rerank import reranked_rankings, rerank_training_records
from lmforge.tasks.finetune import TaskConfig, finetune
from lmforge.train import TrainConfig

MODEL = "all-MiniLM-L6-v2"
DEPTH = 20
RESULTS = Path(__file__).parent / "results" / "rerank.json"


def retrieve(kind: str, passages: list, records: list, work: Path) -> list:
    """Each record's top DEPTH passage ids from BM25 or from all-MiniLM-L6-v2 as it is (dense)."""
    if kind == "bm25":
        return bm25_rankings(BM25Index.build(passages), passages, records, DEPTH)
    encoder = BiEncoder.from_dir(MODEL)
    return dense_rankings(encoder, encode_passages(encoder, passages, work / "index", batch_size=64), records, DEPTH)


def scores(rankings: list, records: list) -> dict:
    """recall@1, recall@5, recall@20 and MRR@10, rounded."""
    table = recall_at_k(rankings, records, (1, 5, DEPTH))
    table["mrr@10"] = mean_reciprocal_rank([r[:10] for r in rankings], records)
    return {k: round(v, 4) for k, v in table.items()}


def main() -> None:
    """Retrieve, train the reranker, rerank, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--retriever", choices=("bm25", "dense"), default="bm25")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--negatives", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=64)
    parser.add_argument("--test", type=int, default=500, help="held-out questions reranked (of 500)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    passages, sets = dictionary_questions(seed=0)
    test = sets["test"][:args.test]
    train = sets["train"][:args.steps * args.batch_size]  # each question seen once
    with tempfile.TemporaryDirectory(prefix="lmforge-rerank-") as tmp:
        work = Path(tmp)
        ranked = retrieve(args.retriever, passages, train + test, work)
        train_ranked, test_ranked = ranked[:len(train)], ranked[len(train):]
        records = rerank_training_records(train, passages, train_ranked, args.negatives)
        retrieved_s = time.perf_counter() - start
        summary = finetune(MODEL, None, "rerank", records, None, work / "run",
                           TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=5e-5, warmup=30, seed=0,
                                       log_every=50, progress=False),
                           TaskConfig(max_len=args.max_len, loss="listwise", negatives=args.negatives),
                           log=lambda *a: None)
        trained_s = time.perf_counter() - start - retrieved_s
        reranked = reranked_rankings(work / "run" / "final", test, passages, test_ranked)
    out = {"data": "dictionary_qa (GCIDE), seed 0", "passages": len(passages), "train_questions": len(records),
           "test_questions": len(test), "retriever": args.retriever if args.retriever == "bm25"
           else f"dense {MODEL} (not fine-tuned)", "reranked_depth": DEPTH,
           "reranker": {"from": MODEL, "loss": "listwise", "negatives": args.negatives, "max_len": args.max_len,
                        "steps": summary["steps"], "batch_size": args.batch_size, "lr": 5e-5},
           "retriever_scores": scores(test_ranked, test), "reranked_scores": scores(reranked, test),
           "seconds": {"retrieve": round(retrieved_s, 1), "train": round(trained_s, 1),
                       "total": round(time.perf_counter() - start, 1)},
           "threads": 1, "torch": torch.__version__, "cpu": platform.processor() or platform.machine()}
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
