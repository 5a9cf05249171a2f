"""The server's parts without a server: limits, the job queue's batching, metrics text (stop strings:
tests/generate/test_stops.py)."""
from __future__ import annotations

import asyncio
import ctypes
import os
import re
import threading
import time

import pytest

from lmforge.serve import worker
from lmforge.serve.jobs import Job, JobQueue
from lmforge.serve.limits import Admission, Limits, RequestError, fit_lengths
from lmforge.serve.metrics import Metrics
from lmforge.serve.records import as_records
from lmforge.serve.routes import split

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? '
                    r'(-?[0-9.e+-]+|\+Inf|-Inf|NaN)$')


def parse_prometheus(text: str) -> dict:
    """Check the text exposition format line by line; returns {family: [(sample name, labels, value)]}.
    Histograms: buckets cumulative, +Inf equal to _count."""
    families, kinds = {}, {}
    for line in text.rstrip("\n").split("\n"):
        if line.startswith(("# HELP ", "# TYPE ")):
            parts = line.split(" ", 3)
            if parts[1] == "TYPE":
                assert parts[3] in ("counter", "gauge", "histogram"), line
                kinds[parts[2]] = parts[3]
                families[parts[2]] = []
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name = match.group(1)
        family = next(f for f in families if name == f or (kinds[f] == "histogram" and name in
                                                              (f + "_bucket", f + "_sum", f + "_count")))
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        families[family].append((name, labels, float(match.group(4))))
    for family, samples in families.items():
        if kinds[family] == "histogram":
            _check_histogram(family, samples)
    return families


def _check_histogram(family: str, samples: list) -> None:
    series = {}
    for name, labels, value in samples:
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        series.setdefault(key, {"buckets": [], "count": None})
        if name.endswith("_bucket"):
            series[key]["buckets"].append(value)
        elif name.endswith("_count"):
            series[key]["count"] = value
    for key, found in series.items():
        assert found["buckets"] == sorted(found["buckets"]), f"{family}{key}: buckets not cumulative"
        assert found["buckets"][-1] == found["count"], f"{family}{key}: +Inf bucket != count"


def test_metrics_render_as_prometheus_text_with_escaped_labels():
    metrics = Metrics()
    metrics.inc("lmforge_requests_total", route='/odd"path\\', status="200")
    for seconds in (0.002, 0.2, 7.0):
        metrics.observe("lmforge_request_seconds", seconds, route="/embed")
    families = parse_prometheus(metrics.render())
    assert families["lmforge_requests_total"] == [("lmforge_requests_total",
                                                   {"route": '/odd\\"path\\\\', "status": "200"}, 1.0)]
    buckets = {s[1]["le"]: s[2] for s in families["lmforge_request_seconds"] if s[0].endswith("_bucket")}
    assert [buckets[le] for le in ("0.001", "0.0025", "0.25", "5", "+Inf")] == [0, 1, 2, 2, 3]
    assert metrics.value("lmforge_request_seconds", route="/embed") == 3


def test_fit_lengths_refuses_or_truncates_naming_the_limit():
    limits = Limits(max_request_tokens=100)
    assert fit_lengths([10, 300], 64, truncate=True, limits=limits) == [10, 64]
    with pytest.raises(RequestError, match="max_tokens=64 in /info") as err:
        fit_lengths([10, 300], 64, truncate=False, limits=limits)
    assert err.value.status == 413 and err.value.param == "max_seq_len"
    with pytest.raises(RequestError, match="max_request_tokens=100"):
        fit_lengths([60, 60], 64, truncate=False, limits=limits)


def test_admission_full_queue_is_429_with_retry_after_from_throughput():
    admission = Admission(Limits(max_queue=2))
    admission.admit(500)
    admission.admit(500)
    admission.tokens_per_second = 300.0
    with pytest.raises(RequestError) as err:
        admission.admit(1)
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "4"  # 1000 tokens at 300/s
    admission.release(500)
    admission.admit(1)  # room again


def test_client_batches_split_within_the_budget_in_order():
    parts = split(list("abcdefg"), [5, 5, 5, 20, 1, 1, 1], Limits(max_batch_tokens=12, max_batch_items=2))
    assert parts == [(["a", "b"], 10), (["c"], 5), (["d"], 20), (["e", "f"], 2), (["g"], 1)]


def test_queue_batches_jobs_of_one_key_within_the_budget_keeping_the_rest_in_order():
    loop = asyncio.new_event_loop()
    try:
        queue = JobQueue()
        jobs = [Job("embed", None, {}, tokens, 1, loop, key=key) for tokens, key in
                [(50, "a"), (50, "b"), (60, "a"), (10, "a"), (10, "a")]]
        for job in jobs:
            queue.put(job)
        first = queue.take()
        assert first is jobs[0]
        assert queue.take_similar("a", 100 - first.tokens, 10) == [jobs[3], jobs[4]]  # 60 does not fit
        assert [queue.take(), queue.take()] == [jobs[1], jobs[2]]
        queue.close()
        assert queue.take() is None
    finally:
        loop.close()


def test_a_batches_only_worker_takes_the_oldest_batchable_job_and_leaves_the_rest_to_the_first():
    loop = asyncio.new_event_loop()
    try:
        queue = JobQueue()
        generate, embed, fill = (Job(kind, None, {}, 5, 1, loop, key=key) for kind, key in
                                 [("generate", None), ("embed", "a"), ("fill_mask", None)])
        for job in (generate, embed, fill):
            queue.put(job)
        assert queue.take(batched_only=True) is embed
        queue.close()
        assert queue.take(batched_only=True) is None  # closed: what is left is the first worker's
        assert [queue.take(), queue.take(), queue.take()] == [generate, fill, None]
    finally:
        loop.close()


def test_a_batchable_job_wakes_one_batch_only_worker_not_all():
    loop = asyncio.new_event_loop()
    queue, woken = JobQueue(), []

    class Counting(threading.Condition):
        def wait(self, timeout=None):
            out = super().wait(timeout)
            woken.append(threading.current_thread().name)
            return out

    queue._batched = Counting(queue._lock)
    waiters = [threading.Thread(target=queue.take, args=(True,), name=f"w{i}") for i in range(4)]
    try:
        for thread in waiters:
            thread.start()
        deadline = time.monotonic() + 5
        while len(queue._batched._waiters) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)  # until all four wait
        queue.put(Job("embed", None, {}, 5, 1, loop, key=("m",)))
        time.sleep(0.2)
        assert len(woken) == 1 and queue.items() == 0  # one woke and took it; three sleep on
        queue.close()
        for thread in waiters:
            thread.join(5)
        assert not any(thread.is_alive() for thread in waiters)
    finally:
        loop.close()


def test_a_batch_held_open_wakes_for_a_batchable_job_only():
    loop = asyncio.new_event_loop()
    queue = JobQueue()
    try:
        for job, woke in ((Job("generate", None, {}, 5, 1, loop), False),
                          (Job("embed", None, {}, 5, 1, loop, key=("m",)), True)):
            threading.Timer(0.1, queue.put, (job,)).start()
            start = time.monotonic()
            queue.wait(1.2)  # a wait that is not woken lasts all of it: 1.2 s, past the 1.0 s below
            assert (time.monotonic() - start < 1.0) == woke  # a generation is no texts for its batch
    finally:
        queue.close()
        loop.close()


def test_a_job_wakes_the_first_worker_even_while_a_batches_only_one_waits():
    loop = asyncio.new_event_loop()
    queue, taken = JobQueue(), {}
    waiters = [threading.Thread(target=lambda only=only: taken.setdefault(only, queue.take(only)))
               for only in (True, False)]
    try:
        for thread in waiters:
            thread.start()
        time.sleep(0.1)  # both waiting
        job = Job("generate", None, {}, 5, 1, loop)
        queue.put(job)
        waiters[1].join(5)
        assert taken.get(False) is job and waiters[0].is_alive()  # the other still waits for a batch
        queue.close()
        waiters[0].join(5)
        assert taken[True] is None
    finally:
        queue.close()
        loop.close()


def test_with_two_workers_a_batch_takes_half_the_queued_texts_not_half_the_jobs():
    limits = Limits()
    runner = worker.Worker(JobQueue(), limits, Metrics(), Admission(limits), share=0.5)
    batches = []
    runner._timed = lambda jobs, run: batches.append(jobs)

    async def dispatch():
        loop = asyncio.get_running_loop()
        jobs = [Job("embed", None, {}, 80, 8, loop, key=("m",)) for _ in range(4)]  # 4 requests of 8 texts
        for job in jobs[1:]:
            runner.queue.put(job)
        runner._dispatch(jobs[0])
        return jobs

    jobs = asyncio.run(dispatch())
    assert batches == [jobs[:2]] and runner.queue.items() == 16  # 16 of the 32 texts; the rest for the other


def test_default_workers_one_per_thread_unless_a_model_generates():
    from types import SimpleNamespace

    from lmforge.serve.app import default_workers

    enc, dec = SimpleNamespace(capabilities=["embed"]), SimpleNamespace(capabilities=["embed", "generate"])
    assert default_workers({"a": enc}, 2) == 2
    assert default_workers({"a": enc, "b": dec}, 2) == 1


def test_threads_that_do_not_divide_go_to_the_first_workers(monkeypatch):
    from types import SimpleNamespace

    from lmforge.serve.app import Server, split_threads

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))  # a machine with the CPUs for it
    assert [split_threads(*a) for a in ((3, 2), (8, 3), (2, 2))] == [[2, 1], [3, 3, 2], [1, 1]]
    server = Server({"a": SimpleNamespace(capabilities=["embed"])}, threads=3, workers=2)
    assert [w.threads for w in server.workers] == [2, 1]  # no thread left idle
    assert [w.share for w in server.workers] == pytest.approx([2 / 3, 1 / 3])  # of the queue and the rate


@pytest.mark.parametrize("workers", [0, 3])
def test_a_server_refuses_workers_outside_one_to_its_threads(workers):
    from types import SimpleNamespace

    from lmforge.serve.app import Server

    with pytest.raises(ValueError, match=rf"workers={workers}: must be between 1 and the threads \(2\)"):
        Server({"a": SimpleNamespace(capabilities=["embed"])}, threads=2, workers=workers)


@pytest.mark.parametrize("kind, inputs, message, field", [
    ("qa", "a bare string", "lacks question, context", "inputs.question"),
    ("cls", {"text": "x", "lable": "pos"}, "unknown field(s) lable", "inputs.lable"),
    ("regression", {"text": "x", "label": "hi"}, "is not a number", "inputs.label"),
    ("choice", {"text": "x", "choices": []}, "choices must be a non-empty list", "inputs.choices"),
    ("tagging", {"text": "a", "words": ["a"]}, "text or words", "inputs"),
    ("cls", [{"text": "ok"}, {"text": [5]}], "text must be text", "inputs.1.text"),
    ("tagging", [{"text": "a"}, {"text": " "}], "text is empty", "inputs.1.text"),
    ("seq2seq", ["ok", {}], "text or source", "inputs.1"),
])
def test_predict_records_name_what_is_wrong(kind, inputs, message, field):
    """The field is named by its path, as the schema names /embed's texts.1 (was param inputs, the index
    only in the message)."""
    with pytest.raises(RequestError, match=re.escape(message)) as err:
        as_records(kind, inputs)
    assert err.value.status == 422 and err.value.param == field
    assert err.value.message.startswith(field + ": ")


def test_limits_refuse_nonsense():
    with pytest.raises(ValueError, match="max_queue"):
        Limits(max_queue=0)
    with pytest.raises(ValueError, match="batch_wait_ms"):
        Limits(batch_wait_ms=float("nan"))


HEAP_PROBE = """
import ctypes, sys
bounded = False
if sys.argv[1] == "bound":  # glibc's default needs no lmforge (whose import is most of a probe's time)
    from lmforge.serve import worker
    bounded = worker.bound_heap()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
libc.free(libc.malloc(16 << 20))  # glibc's moving threshold would now let blocks under 16 MiB into the heap
block = libc.malloc(1 << 20)
heap = next(line.split()[0] for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]"))
low, high = (int(x, 16) for x in heap.split("-"))
print(bounded, low <= block < high)
libc.free(block)
"""


def test_large_blocks_are_kept_out_of_the_heap():
    import sys
    from subprocess import run

    if worker._MALLOPT is None:
        pytest.skip("no glibc: nothing to bound")
    runs = {}
    for mode in ("bound", "default"):  # fresh processes, so each starts from glibc's own settings
        out = run([sys.executable, "-c", HEAP_PROBE, mode], capture_output=True, text=True, check=True)
        runs[mode] = out.stdout.split()
    assert runs["default"] == ["False", "True"]  # unbounded: after one large free, 1 MiB comes from the heap
    assert runs["bound"] == ["True", "False"]  # bounded: its own mapping, given back to the system when freed


def test_the_worker_trims_the_heap_every_so_many_forward_passes(monkeypatch):
    assert worker.trim_heap() is (worker._MALLOC_TRIM is not None)  # glibc here: a real trim
    trims = []
    monkeypatch.setattr(worker, "trim_heap", lambda: trims.append(1) or True)
    limits = Limits()
    runner = worker.Worker(JobQueue(), limits, Metrics(), Admission(limits))

    async def run_all():
        job = Job("embed", None, {}, 8, 1, asyncio.get_running_loop(), key=("m",))
        for _ in range(2 * worker.TRIM_EVERY + 1):
            runner._timed([job], lambda jobs: None)

    asyncio.run(run_all())
    assert len(trims) == 2 and runner.runs == 2 * worker.TRIM_EVERY + 1


PRIMITIVE_PROBE = """
import ctypes, sys
from lmforge.serve import worker
bounded = worker.bound_primitive_cache() if sys.argv[1] == "bound" else False
import torch
import torch.nn.functional as F


class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t)
                for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
torch.set_num_threads(1)
F.gelu(torch.ones(2, 8))
before = libc.mallinfo2().uordblks
for rows in range(3, 303):  # a new shape each call, as unpadded batches give
    F.gelu(torch.ones(rows, 8))
print(bounded, (libc.mallinfo2().uordblks - before) >> 10)
"""


@pytest.mark.slow  # primes the allocator over many shapes: seconds
def test_per_shape_primitives_stay_few():
    import subprocess
    import sys

    if not hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2"):
        pytest.skip("no glibc mallinfo2: nothing to measure")
    runs = {}
    for mode in ("bound", "default"):  # fresh processes: oneDNN reads its cache size once
        env = {k: v for k, v in os.environ.items() if k not in worker._PRIMITIVE_CACHE_VARS}
        out = subprocess.run([sys.executable, "-c", PRIMITIVE_PROBE, mode], capture_output=True, text=True,
                             check=True, env=env)
        runs[mode] = out.stdout.split()
    if int(kib := runs["default"][1]) < 4096:
        pytest.skip(f"this torch keeps no per-shape GELU primitives ({kib} KiB for 300 shapes)")
    assert runs["bound"][0] == "True"
    assert int(runs["bound"][1]) < 40 * worker.PRIMITIVE_CACHE  # KiB: ~28 a primitive, at most 64 of them


def test_a_primitive_cache_size_already_set_stands(monkeypatch):
    monkeypatch.setenv("DNNL_PRIMITIVE_CACHE_CAPACITY", "7")
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    assert worker.bound_primitive_cache() is False
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ
    with pytest.raises(ValueError, match="capacity"):
        worker.bound_primitive_cache(-1)


def test_json_body_parses_to_starlettes_json_and_refuses_nan_as_it_does():
    import json
    import math

    from fastapi.responses import JSONResponse

    from lmforge.serve.schemas import JSONBody

    data = {"embeddings": [[0.1, -3.0000000000000004, 1e-07, 2.5e20]], "text": "é\u2028 NaN said", "n": None}
    assert json.loads(JSONBody(data).body) == json.loads(JSONResponse(data).body) == data
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError):
            JSONBody({"x": [bad]})
