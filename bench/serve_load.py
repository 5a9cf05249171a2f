"""`lmforge serve` under load: all-MiniLM-L6-v2 sentence embeddings, 64 concurrent clients.

    flock /tmp/lmforge-cpu.lock .venv/bin/python -m bench.serve_load [--requests 2000] \
        [--drift-requests 100000 --drift-seconds 600] [--out bench/results/serve_load.json]

Measures, on texts of 8-128 tokens (uniform), one text per request:
- throughput of `lmforge serve` against lmforge's offline batched embed (SentenceEncoder.encode) of the
  same texts (target >= 0.9x), and against a plain FastAPI + sentence-transformers server doing the same
  (a sync endpoint calling model.encode, as the tutorials write it; target: ours >= 1.5x), with p50 / p99
  latency of both; each round measures offline, ours and the reference (servers in alternating order),
  and each ratio is taken within its round, so that the drift of a shared machine falls on all three;
- accuracy: every answer given under load against the offline embedding of its text alone;
- overload: ten times the batch capacity at once: answers (equal to offline) or 429 with Retry-After;
- cold start: process start to /health, and to the first answered embedding;
- the server's resident memory over up to --drift-requests requests (bounded by --drift-seconds):
  drift from the sample after the warm-up to the end.
The load generator (serve_client.py) is a raw asyncio HTTP/1.1 keep-alive client, one connection per
client. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from bench.common import machine
from bench.serve_client import burst, load, rss_mib, start, stop

MODEL = "all-MiniLM-L6-v2"
START_OURS = "import sys; from lmforge.cli import main; sys.exit(main(sys.argv[1:]))"


# ---- the reference server: plain FastAPI + sentence-transformers -----------------------------------

class EmbedBody(BaseModel):
    """The reference server's request body (at module level: FastAPI resolves the annotation here)."""

    texts: list[str]


def reference_server(port: int, threads: int) -> None:
    """Serve POST /embed {"texts": [...]} with sentence-transformers' encode, the plain way."""
    import torch
    import uvicorn
    from fastapi import FastAPI
    from sentence_transformers import SentenceTransformer

    from lmforge.io.resolve import find_model_dir

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(find_model_dir(MODEL)), device="cpu")
    app = FastAPI()

    @app.post("/embed")
    def embed(body: EmbedBody) -> dict:
        return {"embeddings": model.encode(body.texts).tolist()}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    sock = socket.create_server(("127.0.0.1", port))
    print(f"reference: http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


# ---- texts, servers, the load generator --------------------------------------------------------------

def make_texts(n: int, seed: int = 0) -> list:
    """n texts whose token counts (specials included) are uniform in 8..128."""
    from lmforge import load_tokenizer
    from lmforge.data import corpus_text
    from lmforge.io.resolve import find_model_dir

    tokenizer = load_tokenizer(find_model_dir(MODEL))
    words = corpus_text(400, seed).split()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        target, start = rng.randint(8, 128), rng.randrange(len(words) - 200)
        k = max(1, target // 2)
        while len(tokenizer.encode(" ".join(words[start:start + k])).ids) < target:
            k += 1
        while k > 1 and len(tokenizer.encode(" ".join(words[start:start + k])).ids) > target:
            k -= 1
        out.append(" ".join(words[start:start + k]))
    return out


# ---- the measurements --------------------------------------------------------------------------------

class Offline:
    """lmforge's offline embed of the texts, in this process (idle while the servers run)."""

    def __init__(self, threads: int) -> None:
        import torch

        from lmforge.pipelines.embed import SentenceEncoder

        torch.set_num_threads(threads)
        self.encoder = SentenceEncoder.from_dir(MODEL)

    def __call__(self, texts: list) -> dict:
        """Texts per second batched at 32 (the default) and 64; the better of the two counts."""
        self.encoder.encode(texts[:128], batch_size=32)  # warm-up
        out = {}
        for batch_size in (32, 64):
            t = time.perf_counter()
            self.encoder.encode(texts, batch_size=batch_size)
            out[f"batch_{batch_size}"] = round(len(texts) / (time.perf_counter() - t), 1)
        return {**out, "texts_per_s": max(out.values())}

    def singles(self, texts: list):
        """(n, d) each text's embedding computed alone: the answer every request must get."""
        return self.encoder.encode(texts, batch_size=1)


def max_diff(answers: dict, singles) -> float:
    """Largest |difference| of every answer (index -> JSON body) from the offline single-text output."""
    import torch

    index = sorted(answers)
    got = torch.tensor([json.loads(answers[i])["embeddings"][0] for i in index])
    return float((got - singles[index]).abs().max())


def serve_once(name: str, argv: list, texts: list, clients: int, singles) -> tuple:
    """Start one server, warm it, time `texts` through it and check every answer; (run, cold start)."""
    proc, url, health, first = start(argv, "lmforge serve:" if name == "lmforge" else "reference:")
    try:
        load(url, texts[-128:], clients)  # warm-up
        answers: dict = {}
        run = load(url, texts, clients, answers=answers)
        run["max_abs_diff_vs_offline"] = max_diff(answers, singles)
        run["answers_checked"] = len(answers)
    finally:
        stop(proc)
    return run, {"to_health_s": round(health, 2), "to_first_embedding_s": round(first, 2)}


def ours(args, *options: str) -> list:
    """The argv of `lmforge serve` on MiniLM with the bench's threads."""
    return [sys.executable, "-c", START_OURS, "serve", "--model", MODEL, "--port", "0", "--threads",
            str(args.threads), *options]


def rounds(texts: list, args, offline: Offline, singles) -> dict:
    """Rounds of offline, ours and the reference (the servers' order alternating), so that the machine's
    drift falls on all three; the reference, slower, gets half the texts."""
    mine = ours(args, "--max-queue", "4096", "--batch-wait-ms", str(args.batch_wait_ms))
    reference = [sys.executable, str(Path(__file__).resolve()), "--reference-server", "--threads",
                 str(args.threads)]
    out = {"offline": [], "lmforge": [], "reference": [], "cold_start": []}
    for r in range(args.rounds):
        out["offline"].append(offline(texts))
        cold = {}
        for name in (("lmforge", "reference") if r % 2 == 0 else ("reference", "lmforge")):
            argv, some = (mine, texts) if name == "lmforge" else (reference, texts[:len(texts) // 2])
            run, cold[name] = serve_once(name, argv, some, args.clients, singles)
            out[name].append(run)
        out["cold_start"].append(cold)
        out.setdefault("load_average_1min", []).append(round(os.getloadavg()[0], 2))
        print(f"round {r}: {json.dumps({k: v[-1] for k, v in out.items()})}", file=sys.stderr, flush=True)
    return out


def overload(texts: list, args, singles, capacity: int = 64) -> dict:
    """Ten times the batch capacity at once (one connection each) against a queue of 2x the capacity:
    every request is answered at once, 200 (equal to the offline output) or 429 with Retry-After."""
    proc, url, _, _ = start(ours(args, "--max-batch-items", str(capacity), "--max-queue", str(2 * capacity)),
                            "lmforge serve:")
    try:
        found, seconds = burst(url, texts[:10 * capacity])
    finally:
        stop(proc)
    failed = [repr(f) for f in found if isinstance(f, BaseException)]
    statuses = [f[0] for f in found if not isinstance(f, BaseException)]
    ok = {i: f[2] for i, f in enumerate(found) if not isinstance(f, BaseException) and f[0] == 200}
    refused = [f for f in found if not isinstance(f, BaseException) and f[0] == 429]
    return {"requests": len(found), "max_batch_items": capacity, "max_queue": 2 * capacity,
            "answered_200": len(ok), "refused_429": len(refused),
            "other": sorted(set(statuses) - {200, 429}) + failed[:3],
            "every_429_has_retry_after": all(int(f[1].get("retry-after", 0)) >= 1 for f in refused),
            "seconds_to_last_answer": round(seconds, 2),
            "max_abs_diff_vs_offline": max_diff(ok, singles) if ok else None}


def cold_starts(args, times: int = 5) -> dict:
    """Seconds from process start to /health (and to a first embedding), `times` starts of ours; the load
    average of the shared machine at each start says how quiet it was."""
    runs = []
    for _ in range(times):
        load_average = os.getloadavg()[0]
        proc, _, health, first = start(ours(args), "lmforge serve:")
        stop(proc)
        runs.append({"to_health_s": round(health, 2), "to_first_embedding_s": round(first, 2),
                     "load_average_1min": round(load_average, 2)})
    health = [r["to_health_s"] for r in runs]
    return {"median_to_health_s": statistics.median(health), "min_to_health_s": min(health),
            "max_to_health_s": max(health), "runs": runs}


def drift(texts: list, args) -> dict:
    """Our server's resident memory while it answers up to --drift-requests (at most --drift-seconds):
    (requests, seconds, MiB) after each 1000; the drift is taken from the sample after the warm-up."""
    proc, url, _, _ = start(ours(args, "--max-queue", "4096"), "lmforge serve:")
    samples, served, at = [(0, 0.0, round(rss_mib(proc.pid), 1))], 0, 0
    try:
        t0 = time.perf_counter()
        while served < args.drift_requests and time.perf_counter() - t0 < args.drift_seconds:
            chunk = [texts[(at + i) % len(texts)] for i in range(min(1000, args.drift_requests - served))]
            at += len(chunk)
            served += load(url, chunk, args.clients, seconds=args.drift_seconds - (time.perf_counter() - t0))[
                "requests"]
            samples.append((served, round(time.perf_counter() - t0, 1), round(rss_mib(proc.pid), 1)))
    finally:
        stop(proc)
    base = next((s for s in samples if s[0] >= args.drift_warmup), samples[-1])
    end = samples[-1]
    return {"requests": served, "seconds": end[1], "warmup_requests": base[0], "rss_after_warmup_mib": base[2],
            "rss_end_mib": end[2], "drift_mib": round(end[2] - base[2], 1),
            "drift_percent": round(100 * (end[2] - base[2]) / base[2], 2),
            "peak_mib": max(s[2] for s in samples), "samples_requests_seconds_mib": samples}


def summary(result: dict) -> dict:
    """Medians over rounds, and the two ratios the targets are about (each taken within its round)."""
    runs = result["rounds"]
    med = {name: {k: statistics.median(r[k] for r in runs[name]) for k in ("texts_per_s", "p50_ms", "p99_ms")}
           for name in ("lmforge", "reference")}
    ratio = {key: [o["texts_per_s"] / other["texts_per_s"] for o, other in zip(runs["lmforge"], runs[key])]
             for key in ("offline", "reference")}
    cold = [c["lmforge"]["to_health_s"] for c in runs["cold_start"]]
    return {"offline_texts_per_s": statistics.median(r["texts_per_s"] for r in runs["offline"]), **med,
            "vs_offline": round(statistics.median(ratio["offline"]), 3),
            "vs_offline_per_round": [round(x, 3) for x in ratio["offline"]],
            "vs_reference": round(statistics.median(ratio["reference"]), 3),
            "vs_reference_per_round": [round(x, 3) for x in ratio["reference"]],
            "max_abs_diff_vs_offline": max(r["max_abs_diff_vs_offline"] for r in runs["lmforge"]),
            "answers_checked": sum(r["answers_checked"] for r in runs["lmforge"]),
            "cold_start_to_health_s": {"median": statistics.median(cold), "max": max(cold)}}


def main() -> None:
    """Run the benchmark; print its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per timed run of ours")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of offline, ours and the reference")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batch-wait-ms", type=float, default=0.0)
    parser.add_argument("--drift-requests", type=int, default=100_000, help="0: no memory run")
    parser.add_argument("--drift-seconds", type=float, default=600.0, help="the memory run's time limit")
    parser.add_argument("--drift-warmup", type=int, default=2000, help="requests before the drift baseline")
    parser.add_argument("--stop-by", type=float, default=float("inf"),
                        help="a Unix time the memory run must end by (a shared machine's time slot)")
    parser.add_argument("--out", help="also write the JSON here (after each stage)")
    parser.add_argument("--reference-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reference_server:
        reference_server(0, args.threads)
        return
    texts = make_texts(args.requests)
    offline = Offline(args.threads)
    singles = offline.singles(texts)
    result = {"model": MODEL, "clients": args.clients, "threads": args.threads, "requests": args.requests,
              "mean_tokens": round(_mean_tokens(texts), 1), "machine": machine()}
    result["rounds"] = rounds(texts, args, offline, singles)
    result["summary"] = summary(result)
    write(result, args.out)
    result["overload"] = overload(texts, args, singles)
    result["cold_start"] = cold_starts(args)
    write(result, args.out)
    args.drift_seconds = min(args.drift_seconds, args.stop_by - time.time())
    if args.drift_requests > 0 and args.drift_seconds > 30:
        result["rss"] = drift(texts, args)
    print(write(result, args.out))


def write(result: dict, out: str | None) -> str:
    """The result as JSON, written to `out` when given (so that a stage cut short leaves the others)."""
    text = json.dumps(result, indent=2)
    if out:
        Path(out).write_text(text + "\n")
    return text


def _mean_tokens(texts: list) -> float:
    from lmforge import load_tokenizer
    from lmforge.io.resolve import find_model_dir

    tokenizer = load_tokenizer(find_model_dir(MODEL))
    return statistics.mean(len(tokenizer.encode(t).ids) for t in texts)


if __name__ == "__main__":
    main()
