"""Exact inner-product retrieval over 100,000 passages (random unit vectors, d = 384, the width of
all-MiniLM-L6-v2) on 2 threads: ms per query, one query at a time and in batches, for lmforge's
memory-mapped index (one matmul + top-k) and, when installed, faiss.IndexFlatIP on the same rows.

    flock /tmp/lmforge-cpu.lock .venv/bin/python -m bench.retrieval
writes bench/results/retrieval.json.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import machine
from lmforge.retrieval.index import DenseIndex, write_index

N, D, K, THREADS = 100_000, 384, 20, 2
BATCHES = (1, 32)


def _unit(rng, n: int) -> np.ndarray:
    x = rng.standard_normal((n, D)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _ms_per_query(index: DenseIndex, queries: np.ndarray, batch: int, backend: str) -> float:
    index.search(queries[:batch], K, batch_size=batch, backend=backend)  # warm: pages mapped, faiss built
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for i in range(0, len(queries), batch):
            index.search(queries[i:i + batch], K, batch_size=batch, backend=backend)
        best = min(best, (time.perf_counter() - start) * 1000 / len(queries))
    return best


def main() -> None:
    """Build the index, time it, write the JSON."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help: no run
    torch.set_num_threads(THREADS)
    try:
        import faiss

        faiss.omp_set_num_threads(THREADS)
        backends = ("torch", "faiss")
    except ImportError:
        backends = ("torch",)
    rng = np.random.default_rng(0)
    rows, queries = _unit(rng, N), _unit(rng, 256)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        path = write_index(Path(tmp) / "ix", [str(i) for i in range(N)], lambda r: rows[r.start:r.stop], D,
                           model="random-unit", batch_size=4096, progress=False)
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        index = DenseIndex.load(path)
        load_s = time.perf_counter() - start
        results = {f"{b} batch {n}": round(_ms_per_query(index, queries, n, b), 3) for b in backends for n in BATCHES}
        exact = np.argsort(-(queries[:8] @ rows.T), axis=1)[:, :K]
        agree = bool(np.array_equal(index.search(queries[:8], K)[1].numpy(), exact))
    out = {"passages": N, "dim": D, "k": K, "threads": THREADS, "ms_per_query": results,
           "build_s": round(build_s, 2), "load_with_checksum_s": round(load_s, 3), "topk_matches_numpy_sort": agree,
           "torch": torch.__version__, "machine": machine()}
    target = Path(__file__).parent / "results" / "retrieval.json"
    target.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
