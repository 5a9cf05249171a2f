"""The load generator and process handling of bench/serve_load.py.

The client is a raw asyncio HTTP/1.1 keep-alive client (one connection per simulated client), so that it
takes as little as possible of the CPU it shares with the servers under test.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


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
            time.sleep(0.01)
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


def rss_mib(pid: int) -> float:
    """A process's resident set, MiB."""
    return int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1)) / 1024


async def _exchange(reader, writer, host: str, body: bytes) -> tuple:
    """One POST /embed on an open connection: (status, headers, body)."""
    head = (f"POST /embed HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    writer.write(head + body)
    status = int((await reader.readline()).split()[1])
    headers = {}
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, await reader.readexactly(int(headers.get("content-length", 0)))


async def _client(host: str, port: int, bodies, latencies: list, until: float, answers: dict) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for index, body in bodies:
            if time.perf_counter() > until:
                return
            t = time.perf_counter()
            status, _, answer = await _exchange(reader, writer, host, body)
            if status != 200:
                raise RuntimeError(f"answer {status}: {answer[:200]!r}")
            latencies.append(time.perf_counter() - t)
            if answers is not None:
                answers[index] = answer
    finally:
        writer.close()


def _split(url: str) -> tuple:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


async def _load(url: str, items: list, clients: int, seconds: float, answers) -> dict:
    host, port = _split(url)
    bodies = iter([(i, json.dumps({"texts": [t]}).encode()) for i, t in items])
    latencies: list = []
    t0 = time.perf_counter()
    await asyncio.gather(*(_client(host, port, bodies, latencies, t0 + seconds, answers) for _ in range(clients)))
    wall = time.perf_counter() - t0
    ordered = sorted(latencies)
    return {"requests": len(ordered), "seconds": round(wall, 3), "texts_per_s": round(len(ordered) / wall, 1),
            "p50_ms": round(1000 * ordered[len(ordered) // 2], 1),
            "p99_ms": round(1000 * ordered[max(0, int(len(ordered) * 0.99) - 1)], 1)}


def load(url: str, texts: list, clients: int = 64, seconds: float = 1e9, answers: dict | None = None,
         first: int = 0) -> dict:
    """Send `texts` one per request from `clients` concurrent keep-alive connections (a closed loop: each
    client sends its next request when the last is answered); answer bodies go into `answers` by index
    (first + position) when given."""
    items = list(enumerate(texts, first))
    return asyncio.run(_load(url, items, clients, seconds, answers))


async def _one(host: str, port: int, body: bytes) -> tuple:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        return await _exchange(reader, writer, host, body)
    finally:
        writer.close()


async def _burst(url: str, texts: list) -> tuple:
    host, port = _split(url)
    t0 = time.perf_counter()
    found = await asyncio.gather(*(_one(host, port, json.dumps({"texts": [t]}).encode()) for t in texts),
                                 return_exceptions=True)
    return found, time.perf_counter() - t0


def burst(url: str, texts: list) -> tuple:
    """Every text at once, one connection each: ([(status, headers, body) or exception], seconds)."""
    return asyncio.run(_burst(url, texts))
