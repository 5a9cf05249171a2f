"""A client that disconnects stops its generation within a step; SIGTERM answers every admitted request
before the process exits."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest
import torch

from lmforge.pipelines.embed import SentenceEncoder
from tests.serve.conftest import start_server
from tests.serve.test_routes import metric

LONG = {"model": "gen", "prompt": "the cat", "max_new_tokens": 2000, "min_new_tokens": 2000}


def _wait_for(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _cancelled(url: str) -> float:
    return metric(url, "lmforge_generations_total", reason="cancelled")


def _cancelled_steps(url: str) -> float:
    return metric(url, "lmforge_generation_steps", "lmforge_generation_steps_sum", reason="cancelled")


def _steps_settle(url: str) -> float:
    """Decoding steps once they stop moving (another test's generation may be finishing)."""
    steps = metric(url, "lmforge_decode_steps_total")
    time.sleep(0.3)
    assert metric(url, "lmforge_decode_steps_total") == steps, "generation went on after the disconnect"
    return steps


@pytest.mark.parametrize("stream", [True, False])
def test_a_disconnected_client_stops_its_generation_within_a_step(server, stream):
    before = _cancelled(server.url)
    steps_before = _cancelled_steps(server.url)
    received = 0
    # the whole answer's client hangs up after 0.3 s of silence; a stream's after 5 events (its first event
    # may take longer than 0.3 s: a cold server's first steps on a loaded machine took a second)
    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(30, read=30 if stream else 0.3)) as client:
        if stream:
            with client.stream("POST", "/generate", json={**LONG, "stream": True}) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    received += line.startswith("data: ")
                    if received == 5:
                        break  # leaving the block closes the connection
        else:
            with pytest.raises(httpx.ReadTimeout):  # gives up after 0.3 s of silence and hangs up
                client.post("/generate", json=LONG)
    _wait_for(lambda: _cancelled(server.url) == before + 1)
    _steps_settle(server.url)
    ran = _cancelled_steps(server.url) - steps_before
    assert ran < 1000, f"{ran} of 2000 steps ran: the disconnect was not noticed in time"
    if stream:  # the steps whose tokens the client saw, and the few before the server heard of the hang-up
        assert received <= ran <= received + 50
    assert metric(server.url, "lmforge_steps_after_cancel_total") <= _cancelled(server.url)
    for gauge in ("lmforge_queue_requests", "lmforge_queue_tokens", "lmforge_queue_jobs"):  # its place freed
        assert metric(server.url, gauge) == 0, gauge


def _long_generation(url: str, stream: bool, out: dict) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        if not stream:
            response = client.post("/generate", json={**LONG, "max_new_tokens": 1500, "min_new_tokens": 1500})
            out["whole"] = (response.status_code, len(response.json().get("token_ids", [])))
            return
        with client.stream("POST", "/generate", json={**LONG, "max_new_tokens": 1500, "min_new_tokens": 1500,
                                                      "stream": True}) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
        out["stream"] = (response.status_code, len(json.loads(lines[-2][6:])["token_ids"]), lines[-1])


@pytest.mark.slow  # a server of its own stopped mid-request: seconds; CI runs it (make test-slow)
def test_sigterm_drains_admitted_requests_then_exits(model_dirs, tmp_path):
    served = start_server(model_dirs, ("enc", "gen"), tmp_path / "drain.log", "--max-new-tokens", "2000")
    try:
        out: dict = {}
        threads = [threading.Thread(target=_long_generation, args=(served.url, stream, out))
                   for stream in (False, True)]
        for thread in threads:
            thread.start()
        _wait_for(lambda: metric(served.url, "lmforge_decode_steps_total") > 50)  # both admitted, one running
        served.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.TransportError):  # no new connections once draining
            httpx.post(served.url + "/embed", json={"texts": ["late"]}, timeout=5)
        for thread in threads:
            thread.join(60)
        assert out["whole"] == (200, 1500) and out["stream"] == (200, 1500, "data: [DONE]")
        served.proc.wait(30)
        assert served.proc.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after the drain
        assert "lmforge serve: drained" in served.log.read_text()
    finally:
        served.stop(5)


def test_embeddings_are_served_between_the_steps_of_a_long_generation(server, model_dirs):
    done: dict = {"events": 0}
    cancelled = _cancelled(server.url)

    def generate() -> None:
        # hangs up at the first step after the embedding's answer: the generation need not run its 2000 steps
        # for the test to see whether that answer came while it was running
        with httpx.Client(base_url=server.url, timeout=60) as client:
            with client.stream("POST", "/generate", json={**LONG, "stream": True}) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        done["events"] += 1
                        done.setdefault("first", time.monotonic())
                    if "embed" in done:
                        break

    thread = threading.Thread(target=generate)
    thread.start()
    try:
        _wait_for(lambda: "first" in done)
        answer = httpx.post(server.url + "/embed", json={"model": "enc", "texts": ["the cat sat"]},
                            timeout=60)
        done["embed"] = time.monotonic()
    finally:
        thread.join(60)
    assert answer.status_code == 200
    # answered between two decoding steps, not after the 2000 of them: the generation was still running when
    # its client hung up after the answer, and was cancelled
    assert done["events"] < 2000, done
    _wait_for(lambda: _cancelled(server.url) == cancelled + 1)
    expected = SentenceEncoder.from_dir(model_dirs["enc"]).encode(["the cat sat"])[0]
    assert (torch.tensor(answer.json()["embeddings"][0]) - expected).abs().max() <= 1e-5


@pytest.mark.slow  # a server of its own with two workers and a long generation
def test_a_second_worker_embeds_with_a_generating_model_outside_its_step_hook(model_dirs, tmp_path):
    """--workers 2: while the first worker generates with "gen", the second batches embeddings of "gen" and
    "enc"; those forward passes are no decoding steps of the generation (the hook is the first worker's),
    and every answer equals the offline one."""
    served = start_server(model_dirs, ("enc", "gen"), tmp_path / "two.log", "--threads", "2",
                          "--workers", "2", "--max-new-tokens", "2000")
    try:
        info = httpx.get(served.url + "/info", timeout=30).json()
        assert (info["workers"], info["threads_per_worker"], info["threads"]) == (2, [1, 1], 2)
        out: dict = {}
        thread = threading.Thread(target=_long_generation, args=(served.url, False, out))
        thread.start()
        _wait_for(lambda: metric(served.url, "lmforge_decode_steps_total") > 20)
        texts = [f"the {w} sat on the mat" for w in ("cat", "dog", "bird", "fox", "old cat", "red dog")]
        answers = {name: [httpx.post(served.url + "/embed", json={"model": name, "texts": [t]}, timeout=60)
                          for t in texts] for name in ("gen", "enc")}
        generating = metric(served.url, "lmforge_decode_steps_total") < 1500
        thread.join(120)
        assert generating, "the generation ended before the embeddings: nothing ran side by side"
        assert out["whole"] == (200, 1500)
        assert metric(served.url, "lmforge_decode_steps_total") == 1500  # one step per token, none borrowed
        for name, got in answers.items():
            expected = SentenceEncoder.from_dir(model_dirs[name]).encode(texts, batch_size=1)
            assert all(a.status_code == 200 for a in got)
            vectors = torch.tensor([a.json()["embeddings"][0] for a in got])
            assert (vectors - expected).abs().max() <= 1e-5
    finally:
        served.stop(5)


def test_the_server_runs_on_the_allocator_it_reports(server):
    from lmforge.utils.malloc import named_in
    from lmforge.serve import allocator

    with open(f"/proc/{server.proc.pid}/maps") as f:
        maps = f.read()
    # the conftest server runs with --malloc auto: an allocator this test run preloads, else the first of
    # jemalloc, tcmalloc installed, else glibc
    mapped = next(iter(named_in(maps)), "glibc")
    assert mapped == next(iter(named_in(os.environ.get("LD_PRELOAD", ""))), allocator.chosen("auto"))
    assert server.client().get("/health").status_code == 200
