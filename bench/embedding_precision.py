"""How much of a dense retriever's recall survives smaller embeddings, on the dictionary questions
(lmforge.retrieval.dictionary_qa: GCIDE definitions restated with other entries' words; 10,000 entries as
passages, the 500 held-out questions).

DPR is trained from all-MiniLM-L6-v2 on the CPU (in-batch + one BM25 hard negative per question) with a
Matryoshka loss (Kusupati et al. 2022): the DPR loss summed over the prefixes (384, 192, 96, 48) of the
embeddings, each renormalised. Before and after training, recall@1/5/20 of the held-out questions over all
passages for: fp32; the first 96 coordinates (d/4), renormalised; binary (sign bits, Hamming distance);
binary with rescoring (the 20 x m nearest by Hamming re-ordered by the fp32 query against their +-1 bits,
as sentence-transformers; retrieval/reduced.py), for a few multipliers m. Retained: a form's recall over
fp32's at the same k.

    OMP_NUM_THREADS=2 .venv/bin/python -m bench.embedding_precision --save /tmp/dpr-matryoshka
writes bench/results/embedding_precision.json (and the trained bi-encoder to --save). The control, the same
training with the plain loss (--dims 384, the whole width alone: bitwise the plain DPR loss):
    ... -m bench.embedding_precision --dims 384 --no-untrained --out bench/results/embedding_precision_plain.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from bench.common import machine
from lmforge.retrieval.dictionary_qa import dictionary_questions
from lmforge.retrieval.dpr import BiEncoder, passage_text
from lmforge.retrieval.evaluate import recall_at_k, train_dpr
from lmforge.retrieval.reduced import reduced_rankings
from lmforge.train import TrainConfig
from lmforge.utils.atomic import atomic_write_text

MODEL = "all-MiniLM-L6-v2"
KS = (1, 5, 20)
RESULTS = Path(__file__).parent / "results" / "embedding_precision.json"


def measure(encoder: BiEncoder, passages: list, test: list, dims: int, multipliers: tuple) -> dict:
    """{form: recall@1/5/20} of the held-out questions over all passages, for every reduced form."""
    vectors = encoder.encode([passage_text(p) for p in passages], 64, passage=True)
    queries = encoder.encode([r["question"] for r in test], 64)
    table = reduced_rankings(queries, vectors, [p.id for p in passages], max(KS), dims, multipliers)
    return {form: {k: round(v, 4) for k, v in recall_at_k(ranked, test, KS).items()} for form, ranked in table.items()}


def retained(table: dict) -> dict:
    """{form: {recall@k: its recall / fp32's}} for every form but fp32."""
    fp32 = table["fp32"]
    return {form: {k: round(v / fp32[k], 4) if fp32[k] else None for k, v in scores.items()}
            for form, scores in table.items() if form != "fp32"}


def arguments() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", help="folder for the trained bi-encoder (default: a temporary one, removed)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--dims", type=int, nargs="+", default=[384, 192, 96, 48], help="Matryoshka prefixes")
    parser.add_argument("--weights", type=float, nargs="*", default=[], help="their weights (default all 1)")
    parser.add_argument("--multipliers", type=int, nargs="+", default=[1, 2, 4, 10], help="rescore multipliers")
    parser.add_argument("--passages", type=int, default=10_000, help="dictionary entries (smaller for a smoke run)")
    parser.add_argument("--test", type=int, default=500, help="held-out questions")
    parser.add_argument("--untrained", action=argparse.BooleanOptionalAction, default=True,
                        help="measure all-MiniLM-L6-v2 as it is too")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args()


def main() -> None:
    """Measure untrained, train with the Matryoshka loss, measure again, write the JSON."""
    args = arguments()
    start = time.perf_counter()
    passages, sets = dictionary_questions(n_passages=args.passages, n_test=args.test, seed=0)
    test, train = sets["test"], sets["train"][:args.steps * args.batch_size]
    options = {"matryoshka_dims": args.dims, "matryoshka_weights": args.weights}
    base = BiEncoder.from_dir(MODEL)  # measured as it is; training starts from a fresh copy below
    quarter = base.width // 4
    untrained = measure(base, passages, test, quarter, tuple(args.multipliers)) if args.untrained else None
    del base
    measured_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="lmforge-precision-") as tmp:
        cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup=20, seed=0, log_every=50,
                          save_every=0, progress=False)
        encoder = train_dpr(BiEncoder.from_dir(MODEL, **options), train, passages, Path(tmp) / "run", cfg,
                            log=lambda *a: None)
        trained_s = time.perf_counter() - start - measured_s
        if args.save:
            shutil.copytree(Path(tmp) / "run" / "final", args.save, dirs_exist_ok=True)
    trained = measure(encoder, passages, test, quarter, tuple(args.multipliers))
    out = {"data": "dictionary_qa (GCIDE), seed 0", "passages": len(passages), "test_questions": len(test),
           "train_questions": len(train), "model": MODEL,
           "training": {"loss": "DPR in-batch + 1 BM25 hard negative, Matryoshka sum", "matryoshka_dims": args.dims,
                        "matryoshka_weights": args.weights or [1.0] * len(args.dims), "steps": args.steps,
                        "batch_size": args.batch_size, "lr": args.lr, "warmup": 20, "seed": 0},
           "forms": {"fp32": "exact inner product of the normalised embeddings",
                     f"first {quarter}": "the first d/4 coordinates, renormalised (Matryoshka)",
                     "binary": "sign bits, Hamming distance (ties: lower passage index)",
                     "binary rescored xM": "the 20*M nearest by Hamming, re-ordered by fp32 query . +-1 bits"},
           "untrained": untrained, "trained": trained,
           "retained": {"untrained": retained(untrained) if untrained else None, "trained": retained(trained)},
           "saved": args.save,
           "seconds": {"measure_untrained": round(measured_s, 1), "train": round(trained_s, 1),
                       "total": round(time.perf_counter() - start, 1)},
           "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
           "torch": torch.__version__, "machine": machine()}
    atomic_write_text(args.out, json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
