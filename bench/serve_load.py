"""`lmforge serve` under load: all-MiniLM-L6-v2 sentence embeddings, 64 concurrent clients.

    flock /tmp/lmforge-cpu.lock .venv/bin/python bench/serve_load.py [--requests 2000] [--drift-seconds 150]

Measures, on texts of 8-128 tokens (uniform), one text per request:
- throughput of `lmforge serve` against lmforge's offline batched embed (SentenceEncoder.encode) of the
  same texts (target >= 0.9x), and against a plain FastAPI + sentence-transformers server doing the same
  (a sync endpoint calling model.encode, as the tutorials write it; target: ours >= 1.5x), with p50 / p99
  latency of both; each round measures offline, ours and the reference (servers in alternating order),
  and each ratio is taken within its round, so that the drift of a shared machine falls on all three;
- accuracy: the answers given under load against offline single-text embeddings;
- cold start: process start to /health, and to the first answered embedding;
- the server's resident memory over a few minutes of requests (drift after warm-up).
The load generator is a raw asyncio HTTP/1.1 keep-alive client (one connection per client), so that it
takes as little as possible of the CPU the servers share with it. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
MODEL = "all-MiniLM-L6-v2"
KEPT = 128  # answers kept per run to compare with offline single-text output
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


def start(argv: list, marker: str) -> tuple:
    """Start a server process; (process, base URL, seconds to /health, seconds to a first embedding)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    try:
        return _ready(proc, marker, t0)
    except BaseException:
        stop(proc)
        raise


def _ready(proc, marker: str, t0: float) -> tuple:
    line = proc.stdout.readline()
    if marker not in line:
        raise RuntimeError(f"server did not start: {line!r}")
    url = re.search(r"http://[\d.]+:\d+", line).group(0)
    deadline = time.perf_counter() + 120
    while time.perf_counter() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.02)
    else:
        raise RuntimeError("the server never answered /health")
    health = time.perf_counter() - t0
    httpx.post(url + "/embed", json={"texts": ["warm up"]}, timeout=60).raise_for_status()
    return proc, url, health, time.perf_counter() - t0


def stop(proc) -> None:
    """SIGTERM, then SIGKILL."""
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _client(host: str, port: int, bodies, latencies: list, until: float, kept: dict) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for index, body in bodies:
            if time.perf_counter() > until:
                return
            head = (f"POST /embed HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            t = time.perf_counter()
            writer.write(head + body)
            status = await reader.readline()
            length = 0
            while (line := await reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            answer = await reader.readexactly(length)
            if b" 200 " not in status:
                raise RuntimeError(f"answer {status!r}")
            latencies.append(time.perf_counter() - t)
            if index < KEPT:  # checked against offline output after the run (answers under load)
                kept[index] = answer
    finally:
        writer.close()


async def _load(url: str, texts: list, clients: int, seconds: float, kept: dict) -> dict:
    host, port = url.removeprefix("http://").split(":")
    bodies = iter([(i, json.dumps({"texts": [t]}).encode()) for i, t in enumerate(texts)])
    latencies: list = []
    t0 = time.perf_counter()
    until = t0 + seconds
    await asyncio.gather(*(_client(host, int(port), bodies, latencies, until, kept) for _ in range(clients)))
    wall = time.perf_counter() - t0
    ordered = sorted(latencies)
    return {"requests": len(ordered), "seconds": round(wall, 3), "texts_per_s": round(len(ordered) / wall, 1),
            "p50_ms": round(1000 * ordered[len(ordered) // 2], 1),
            "p99_ms": round(1000 * ordered[int(len(ordered) * 0.99) - 1], 1)}


def load(url: str, texts: list, clients: int = 64, seconds: float = 1e9, kept: dict | None = None) -> dict:
    """Send `texts` one per request from `clients` concurrent connections (closed loop); the answers to
    the first KEPT texts go into `kept`."""
    return asyncio.run(_load(url, texts, clients, seconds, {} if kept is None else kept))


def rss_mib(pid: int) -> float:
    """A process's resident set, MiB."""
    return int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1)) / 1024


# ---- the measurements --------------------------------------------------------------------------------

class Offline:
    """lmforge's offline batched embed of the same texts, in this process (idle while servers run)."""

    def __init__(self, threads: int) -> None:
        import torch

        from lmforge.apps.embed import SentenceEncoder

        torch.set_num_threads(threads)
        self.encoder = SentenceEncoder.from_dir(MODEL)

    def __call__(self, texts: list) -> dict:
        """Texts per second at batch 32 (the default) and 64; the better of the two counts."""
        self.encoder.encode(texts[:128], batch_size=32)  # warm-up
        out = {}
        for batch_size in (32, 64):
            t = time.perf_counter()
            self.encoder.encode(texts, batch_size=batch_size)
            out[f"batch_{batch_size}"] = round(len(texts) / (time.perf_counter() - t), 1)
        return {**out, "texts_per_s": max(out.values())}


def serve_once(name: str, argv: list, texts: list, clients: int) -> tuple:
    """Start one server, warm it, time `texts` through it; (run, cold start)."""
    proc, url, health, first = start(argv, "lmforge serve:" if name == "lmforge" else "reference:")
    try:
        load(url, texts[:512], clients)  # warm-up
        kept: dict = {}
        run = load(url, texts, clients, kept=kept)
        run["max_abs_diff_vs_offline"] = accuracy(texts, kept)
    finally:
        stop(proc)
    return run, {"to_health_s": round(health, 2), "to_first_embedding_s": round(first, 2)}


def rounds(texts: list, args) -> dict:
    """Rounds of offline, ours and the reference (the servers' order alternating), so that the machine's
    drift falls on all three; the reference, slower, gets half the texts."""
    ours = [sys.executable, "-c", START_OURS, "serve", "--model", MODEL, "--port", "0", "--threads",
            str(args.threads), "--max-queue", "4096", "--batch-wait-ms", str(args.batch_wait_ms)]
    reference = [sys.executable, str(Path(__file__).resolve()), "--reference-server", "--threads",
                 str(args.threads)]
    offline, out = Offline(args.threads), {"offline": [], "lmforge": [], "reference": [], "cold_start": []}
    for r in range(args.rounds):
        out["offline"].append(offline(texts))
        cold = {}
        for name in (("lmforge", "reference") if r % 2 == 0 else ("reference", "lmforge")):
            argv, some = (ours, texts) if name == "lmforge" else (reference, texts[:len(texts) // 2])
            run, cold[name] = serve_once(name, argv, some, args.clients)
            out[name].append(run)
        out["cold_start"].append(cold)
    return out


def accuracy(texts: list, kept: dict) -> float:
    """Largest |difference| of answers given under load from offline single-text embeddings."""
    import torch

    from lmforge.apps.embed import SentenceEncoder

    encoder = SentenceEncoder.from_dir(MODEL)
    index = sorted(kept)
    got = torch.tensor([json.loads(kept[i])["embeddings"][0] for i in index])
    return float((got - encoder.encode([texts[i] for i in index], batch_size=1)).abs().max())


def drift(texts: list, args) -> dict:
    """Our server's resident memory while it answers requests for --drift-seconds."""
    argv = [sys.executable, "-c", START_OURS, "serve", "--model", MODEL, "--port", "0", "--threads",
            str(args.threads), "--max-queue", "4096"]
    proc, url, _, _ = start(argv, "lmforge serve:")
    samples, served = [], 0
    try:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.drift_seconds:
            served += load(url, texts, args.clients, seconds=10)["requests"]
            samples.append((round(time.perf_counter() - t0, 1), round(rss_mib(proc.pid), 1)))
    finally:
        stop(proc)
    settled = [m for t, m in samples if t >= 30] or [samples[-1][1]]
    return {"requests": served, "rss_mib": samples, "after_warmup_mib": settled[0], "end_mib": settled[-1],
            "drift_mib": round(settled[-1] - settled[0], 1)}


def summary(result: dict) -> dict:
    """Medians over rounds, and the two ratios the targets are about (each taken within its round)."""
    runs = result["rounds"]
    med = {name: {k: statistics.median(r[k] for r in runs[name]) for k in ("texts_per_s", "p50_ms", "p99_ms")}
           for name in ("lmforge", "reference")}
    ratio = {key: [o["texts_per_s"] / other["texts_per_s"] for o, other in zip(runs["lmforge"], runs[key])]
             for key in ("offline", "reference")}
    return {"offline_texts_per_s": statistics.median(r["texts_per_s"] for r in runs["offline"]), **med,
            "vs_offline": round(statistics.median(ratio["offline"]), 3),
            "vs_reference": round(statistics.median(ratio["reference"]), 3),
            "max_abs_diff_vs_offline": max(r["max_abs_diff_vs_offline"] for r in runs["lmforge"])}


def main() -> None:
    """Run the benchmark; print its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per timed run of ours")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of offline, ours and the reference")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batch-wait-ms", type=float, default=0.0)
    parser.add_argument("--drift-seconds", type=float, default=150.0)
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--reference-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reference_server:
        reference_server(0, args.threads)
        return
    texts = make_texts(args.requests)
    result = {"model": MODEL, "clients": args.clients, "threads": args.threads, "requests": args.requests,
              "mean_tokens": round(_mean_tokens(texts), 1), "cpu": _cpu()}
    result["rounds"] = rounds(texts, args)
    result["summary"] = summary(result)
    if args.drift_seconds > 0:
        result["rss"] = drift(texts, args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


def _mean_tokens(texts: list) -> float:
    from lmforge import load_tokenizer
    from lmforge.io.resolve import find_model_dir

    tokenizer = load_tokenizer(find_model_dir(MODEL))
    return statistics.mean(len(tokenizer.encode(t).ids) for t in texts)


def _cpu() -> str:
    found = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
    return found.group(1) if found else "unknown"


if __name__ == "__main__":
    main()
