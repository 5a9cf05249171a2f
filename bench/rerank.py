"""A cross-encoder reranker over a retriever's top 20 on the dictionary questions (lmforge.retrieval.dictionary_qa:
GCIDE definitions restated with other entries' words; 10,000 entries as passages, 500 held-out questions).

The reranker is fine-tuned from all-MiniLM-L6-v2 (`lmforge finetune --task rerank`'s job: one output over
[CLS] question [SEP] title. definition [SEP]) on training questions, each with its positive and the
retriever's first hard negatives (listwise softmax loss), on one thread. The held-out questions' top 20
from the retriever are then re-ordered by it: recall@1, recall@5 and MRR@10 before and after.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.rerank [--retriever bm25|dense] [--steps 300] [--out FILE]
writes --out, else bench/results/rerank.json (bm25) or rerank_dense.json (dense: all-MiniLM-L6-v2 as it
is, or a trained DPR directory with --dense-model DIR, e.g. bench.embedding_precision's --save; --reranker-from
DIR starts the cross-encoder from that encoder instead of all-MiniLM-L6-v2).
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from bench.common import machine
from lmforge.retrieval.bm25 import BM25Index
from lmforge.retrieval.dictionary_qa import dictionary_questions
from lmforge.retrieval.dpr import BiEncoder
from lmforge.retrieval.evaluate import bm25_rankings, dense_rankings, encode_passages, mean_reciprocal_rank, recall_at_k
from lmforge.retrieval.rerank import reranked_rankings, rerank_training_records
from lmforge.tasks.finetune import TaskConfig, finetune
from lmforge.train import TrainConfig
from lmforge.utils.atomic import atomic_write_text

MODEL = "all-MiniLM-L6-v2"
DEPTH = 20
RESULTS = {"bm25": Path(__file__).parent / "results" / "rerank.json",
           "dense": Path(__file__).parent / "results" / "rerank_dense.json"}


def retrieve(kind: str, passages: list, records: list, work: Path, dense_model: str = MODEL) -> list:
    """Each record's top DEPTH passage ids from BM25 or from a dense bi-encoder (all-MiniLM-L6-v2 as it
    is, or a trained DPR directory)."""
    if kind == "bm25":
        return bm25_rankings(BM25Index.build(passages), passages, records, DEPTH)
    encoder = BiEncoder.from_dir(dense_model)
    return dense_rankings(encoder, encode_passages(encoder, passages, work / "index", batch_size=64), records, DEPTH)


def scores(rankings: list, records: list) -> dict:
    """recall@1, recall@5, recall@20 and MRR@10, rounded."""
    table = recall_at_k(rankings, records, (1, 5, DEPTH))
    table["mrr@10"] = mean_reciprocal_rank([r[:10] for r in rankings], records)
    return {k: round(v, 4) for k, v in table.items()}


def paired_at_1(retrieved: list, reranked: list, records: list) -> dict:
    """Questions whose first passage the reranker made right (gained) and made wrong (lost)."""
    gained = lost = 0
    for record, before, after in zip(records, retrieved, reranked):
        positives = set(record["positives"])
        was, now = before[0] in positives, after[0] in positives
        gained, lost = gained + (now and not was), lost + (was and not now)
    return {"gained": gained, "lost": lost}


def describe(kind: str, dense_model: str) -> str:
    """The retriever as the JSON names it."""
    if kind == "bm25":
        return "bm25"
    if dense_model == MODEL:
        return f"dense {MODEL} (not fine-tuned)"
    return f"dense, trained DPR from {dense_model}"


def arguments(argv=None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--retriever", choices=("bm25", "dense"), default="bm25")
    parser.add_argument("--dense-model", default=MODEL, help="--retriever dense: a bi-encoder directory "
                        "(a trained DPR's) or all-MiniLM-L6-v2 as it is")
    parser.add_argument("--reranker-from", default=MODEL, help="the encoder the cross-encoder starts from: "
                        "all-MiniLM-L6-v2, or a directory (the trained DPR's encoder, which knows the paraphrases)")
    parser.add_argument("--save", help="also keep the trained reranker in this folder (with bench_rankings.json: "
                        "the test questions, their retrieved and reranked ids)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--negatives", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=64)
    parser.add_argument("--test", type=int, default=500, help="held-out questions reranked (of 500)")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="the JSON to write (default: the retriever's file in bench/results; "
                                      "give another for a run with another --dense-model, so the kept one stays)")
    args = parser.parse_args(argv)
    if args.dense_model != MODEL and args.retriever != "dense":
        parser.error("--dense-model needs --retriever dense")
    return args


def train_and_rerank(args, passages: list, train: list, test: list, start: float) -> tuple:
    """(the test questions' retrieved ids, their reranked ids, the training records, the run's summary,
    {"retrieve", "train": seconds}, retrieval counted from `start`, the run's start)."""
    clock = {"start": start}
    with tempfile.TemporaryDirectory(prefix="lmforge-rerank-") as tmp:
        work = Path(tmp)
        ranked = retrieve(args.retriever, passages, train + test, work, args.dense_model)
        train_ranked, test_ranked = ranked[:len(train)], ranked[len(train):]
        records = rerank_training_records(train, passages, train_ranked, args.negatives)
        clock["retrieve"] = time.perf_counter()
        summary = finetune(args.reranker_from, None, "rerank", records, None, work / "run",
                           TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup=30, seed=0,
                                       log_every=50, progress=False),
                           TaskConfig(max_len=args.max_len, loss="listwise", negatives=args.negatives),
                           log=lambda *a: None)
        clock["train"] = time.perf_counter()
        reranked = reranked_rankings(work / "run" / "final", test, passages, test_ranked)
        if args.save:  # the reranker, and what it was given and gave, for a check against the server's /rerank
            shutil.copytree(work / "run" / "final", args.save, dirs_exist_ok=True)
            atomic_write_text(Path(args.save) / "bench_rankings.json", json.dumps(
                {"questions": [r["question"] for r in test], "retrieved": test_ranked, "reranked": reranked}))
    seconds = {"retrieve": round(clock["retrieve"] - clock["start"], 1),
               "train": round(clock["train"] - clock["retrieve"], 1)}
    return test_ranked, reranked, records, summary, seconds


def main(argv=None) -> None:
    """Retrieve, train the reranker, rerank, write the JSON."""
    args = arguments(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    passages, sets = dictionary_questions(seed=0)
    test = sets["test"][:args.test]
    train = sets["train"][:args.steps * args.batch_size]  # each question seen once
    test_ranked, reranked, records, summary, seconds = train_and_rerank(args, passages, train, test, start)
    out = {"data": "dictionary_qa (GCIDE), seed 0", "passages": len(passages), "train_questions": len(records),
           "test_questions": len(test), "retriever": describe(args.retriever, args.dense_model),
           "reranked_depth": DEPTH,
           "reranker": {"from": args.reranker_from, "loss": "listwise", "negatives": args.negatives, "max_len": args.max_len,
                        "steps": summary["steps"], "batch_size": args.batch_size, "lr": args.lr},
           "retriever_scores": scores(test_ranked, test), "reranked_scores": scores(reranked, test),
           "recall@1_paired": paired_at_1(test_ranked, reranked, test),
           "seconds": {**seconds, "total": round(time.perf_counter() - start, 1)},
           "threads": args.threads, "torch": torch.__version__, "machine": machine()}
    target = Path(args.out) if args.out else RESULTS[args.retriever]
    atomic_write_text(target, json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
