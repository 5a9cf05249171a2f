"""The threads that own the models: a job queue, dynamic batching, and stopping between steps.

The event loop only parses, counts tokens and answers; every forward pass runs in a worker, so the
loop never blocks on the model, and the workers' intra-op threads (torch.set_num_threads, threads
divided among the workers) are the only threads computing: nothing oversubscribes the cores.

Workers. The first worker runs every kind of job; any others (Server's `workers`) take batchable
jobs only, each its own batch on its own share of the cores. Two one-thread workers encode
all-MiniLM-L6-v2 batches ~10 % faster than one two-thread worker on 2 cores (no intra-op barrier
per op, and the event loop's turns stall one batch, not both cores); generation keeps one worker
with every thread, as a decoding step is latency.

Batching. A worker takes the oldest job it may run; when it is batchable (embeddings, predictions),
it takes with it every queued job of the same model and settings that fits the token budget
(Limits.max_batch_tokens / max_batch_items; with several workers, at most its share of the queue),
in arrival order, and runs them as one forward pass
(the model's unpadded path, job_kinds.py). Jobs larger than the budget never exist: the event loop
splits a client's batch into budget-sized jobs.

Stopping. While a job that is not batched runs (generation, fill-mask, an attention view), a forward
pre-hook on its model runs before each forward pass of the first worker, that is before each decoding
step: it raises Cancelled when the client has gone, so a cancelled generation stops within one step, and
it serves one waiting batch of another model, so embeddings are not held up behind a long generation.

Sharing. Batches of one model run in several workers at once; a job that changes the model while it
runs (the attention view) waits for them and they for it (gate.py).
"""
from __future__ import annotations

import ctypes
import math
import os
import threading
import time
from contextlib import contextmanager, nullcontext

import torch

from lmforge.serve import allocator, generation, job_kinds
from lmforge.serve.gate import gate_of
from lmforge.serve.jobs import Job, JobQueue
from lmforge.serve.limits import RequestError

TRIM_EVERY = 32  # forward passes between heap trims

try:  # glibc keeps freed blocks of every tensor size it has seen: measured here, unpadded batches of
    # varying shapes grew the server's RSS 75 % over 20k requests without it, and not at all with it
    _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
    _MALLOPT = ctypes.CDLL("libc.so.6").mallopt
except (OSError, AttributeError):  # not glibc: nothing to trim
    _MALLOC_TRIM = _MALLOPT = None


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc's malloc_trim); False where there is none."""
    return bool(_MALLOC_TRIM is not None and _MALLOC_TRIM(0) is not None)


MMAP_THRESHOLD = 128 * 1024  # bytes: glibc's starting value, fixed
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def bound_heap(threshold: int = MMAP_THRESHOLD) -> bool:
    """Serve every allocation of `threshold` bytes or more from a mapping of its own, unmapped when
    freed (glibc's mallopt M_MMAP_THRESHOLD); False where there is no glibc.

    Why: glibc raises its threshold each time a mapped block is freed, so after the first batches
    every tensor-sized block comes from the heap, and batches of ever-different shapes fragment it.
    Measured (MiniLM, one thread, 80 in-process embed batches of 1-64 texts): with the heap trim
    alone the resident size went 576 -> 814 MiB and kept rising; with the threshold fixed, 458 -> 472."""
    return bool(_MALLOPT is not None and _MALLOPT(_M_MMAP_THRESHOLD, int(threshold)) == 1)


PRIMITIVE_CACHE = 64  # oneDNN primitives kept (its default: 1024)
_PRIMITIVE_CACHE_VARS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")


def bound_primitive_cache(capacity: int = PRIMITIVE_CACHE) -> bool:
    """Keep at most `capacity` oneDNN primitives cached (ONEDNN_PRIMITIVE_CACHE_CAPACITY); False where
    the environment already sets it (the user's value stands). oneDNN reads it once, at its first
    primitive: call this before any forward pass.

    Why: on CPU, torch runs exact GELU (float, contiguous) as a oneDNN primitive, cached by shape,
    ~28 KiB each. Unpadded batches have a new row count almost every time, so the default cache of
    1024 grew the C heap ~27 KiB a batch up to ~28 MiB (MiniLM, in-process embed batches: RSS +4 MiB
    per 100 batches); bounded, it stops at ~1.8 MiB. A miss costs ~80 us a GELU, answers are unchanged."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    if any(name in os.environ for name in _PRIMITIVE_CACHE_VARS):
        return False
    os.environ[_PRIMITIVE_CACHE_VARS[0]] = str(int(capacity))
    return True


def bound_memory(choice: str = "auto") -> str:
    """Bound what batches of changing shapes grow, before the models load: glibc's heap where the
    process runs on glibc (bound_heap; jemalloc and tcmalloc pool freed blocks themselves) and oneDNN's
    primitive cache; returns the allocator (allocator.active(choice): refuses a --malloc allocator
    that is not loaded)."""
    malloc = allocator.active(choice)
    if malloc == "glibc":
        bound_heap()
    bound_primitive_cache()
    return malloc


class Cancelled(Exception):
    """The job's client has gone: raised between two forward passes to end the job."""


class Worker(threading.Thread):
    """Runs queued jobs until the queue is closed and drained: every kind, or batchable ones only."""

    def __init__(self, queue: JobQueue, limits, metrics, admission, threads: int = 0,
                 batched_only: bool = False, share: float = 1.0, name: str = "lmforge-serve-worker") -> None:
        super().__init__(name=name, daemon=True)
        self.queue, self.limits, self.metrics, self.admission = queue, limits, metrics, admission
        self.threads, self.batched_only = threads, batched_only  # threads 0: the process's setting
        self.share = share  # its part of the server's threads: of the queue it takes, of the rate it makes
        self.current: Job | None = None  # the job whose model the forward hook watches
        self.runs = 0  # forward passes run (batches and single jobs), for the heap trim

    def run(self) -> None:
        """The worker loop."""
        if self.threads:
            # this thread's intra-op team (OpenMP's setting is per thread)
            torch.set_num_threads(self.threads)
        while (job := self.queue.take(self.batched_only)) is not None:
            self._dispatch(job)

    def _dispatch(self, job: Job) -> None:
        if job.cancelled:
            job.settle(error=Cancelled())
            return
        if job.key is None:
            self._timed([job], self._run_alone)
            return
        items = self.limits.max_batch_items
        if self.share < 1:  # its share of the queued texts, the rest left to the other workers (MiniLM,
            # 2 x 1 thread: 105 texts/s, p99 0.85 s; taking all that fits, 102 and 1.36 s: one long batch
            # behind another)
            items = min(items, math.ceil((self.queue.items() + job.size) * self.share))
        batch = self._fill([job], items)
        deadline = time.perf_counter() + self.limits.batch_wait_ms / 1000
        while (time.perf_counter() < deadline and sum(j.tokens for j in batch) < self.limits.max_batch_tokens
               and sum(j.size for j in batch) < items):
            self.queue.wait(deadline - time.perf_counter())  # a moment for a fuller batch, when asked
            batch = self._fill(batch, items)
        self._timed(_live(batch), self._run_batch)

    def _fill(self, batch: list, items: int | None = None) -> list:
        """`batch` with the queued jobs of its key that fit what is left of the budget (and of `items`)."""
        tokens = self.limits.max_batch_tokens - sum(j.tokens for j in batch)
        items = (items or self.limits.max_batch_items) - sum(j.size for j in batch)
        return batch + self.queue.take_similar(batch[0].key, tokens, items)

    def _timed(self, jobs: list, run) -> None:
        if not jobs:
            return
        start = time.perf_counter()
        for job in jobs:
            self.metrics.observe("lmforge_phase_seconds", start - job.enqueued, phase="queue")
        run(jobs)
        seconds = time.perf_counter() - start
        self.runs += 1
        if self.runs % TRIM_EVERY == 0:
            trim_heap()
        tokens = sum(j.tokens for j in jobs)
        self.metrics.inc("lmforge_worker_busy_seconds_total", seconds)
        self.metrics.observe("lmforge_phase_seconds", seconds, phase="compute", kind=jobs[0].kind)
        if seconds > 0 and jobs[0].key is not None:  # throughput of batched work: Retry-After's estimate
            rate = tokens / seconds / self.share
            old = self.admission.tokens_per_second
            self.admission.tokens_per_second = rate if old == 0 else 0.8 * old + 0.2 * rate
            self.metrics.set("lmforge_tokens_per_second", self.admission.tokens_per_second)

    def _run_batch(self, jobs: list) -> None:
        kind = jobs[0].kind
        self.metrics.observe("lmforge_batch_size", sum(j.size for j in jobs), kind=kind)
        self.metrics.observe("lmforge_batch_tokens", sum(j.tokens for j in jobs), kind=kind)
        self.metrics.inc("lmforge_tokens_total", sum(j.tokens for j in jobs), kind=kind)
        try:
            # beside other workers' batches, not an attention view
            with gate_of(jobs[0].served.model).shared():
                results = job_kinds.BATCHED[kind](jobs[0].served, [j.payload for j in jobs])
        except Exception as err:  # noqa: BLE001 - one bad job must not fail its neighbours
            if len(jobs) > 1:
                for job in jobs:
                    self._run_batch([job])
                return
            jobs[0].settle(error=_as_request_error(err))
            return
        for job, result in zip(jobs, results):
            job.settle(result)

    def _run_alone(self, jobs: list) -> None:
        (job,) = jobs
        self.metrics.inc("lmforge_tokens_total", job.tokens, kind=job.kind)
        try:
            with self._watch(job), (gate_of(job.served.model).exclusive() if job.kind in job_kinds.EXCLUSIVE
                                    else nullcontext()):
                result = generation.run(job.served, job.payload, job.emit) if job.kind == "generate" \
                    else job_kinds.ALONE[job.kind](job.served, job.payload)
        except Cancelled as err:
            self._finished(job, "cancelled")
            job.settle(error=err)
            return
        except Exception as err:  # noqa: BLE001 - reported to the client, the worker goes on
            self._finished(job, "error")
            job.settle(error=_as_request_error(err))
            return
        if job.kind == "generate":
            self._finished(job, result["finish_reason"])
            self.metrics.inc("lmforge_tokens_total", len(result["token_ids"]), kind="generated")
        job.settle(result)

    def _finished(self, job: Job, reason: str) -> None:
        if job.kind == "generate":
            self.metrics.inc("lmforge_generations_total", reason=reason)
            self.metrics.observe("lmforge_generation_steps", job.steps, reason=reason)

    @contextmanager
    def _watch(self, job: Job):
        """Run `job` with the step hook on its model (see the module docstring)."""
        last = [time.perf_counter()]

        def before_step(module, args):
            if threading.current_thread() is not self:  # another worker's batch of the same model
                return
            if job.cancelled:
                raise Cancelled()
            now = time.perf_counter()
            if job.kind == "generate":  # fill-mask's and the attention view's passes are not decoding steps
                if job.steps:  # the time of the step that just ended (the first: the prompt's)
                    self.metrics.observe("lmforge_phase_seconds", now - last[0],
                                         phase="first_token" if job.steps == 1 else "decode_step")
                self.metrics.inc("lmforge_decode_steps_total")
            job.steps += 1
            self._interleave(job)
            last[0] = time.perf_counter()

        handle = job.served.model.register_forward_pre_hook(before_step)
        previous, self.current = self.current, job
        try:
            yield
        finally:
            handle.remove()
            self.current = previous
            if job.cancelled:
                self.metrics.inc("lmforge_steps_after_cancel_total", max(0, job.steps - job.steps_at_cancel))

    def _interleave(self, busy: Job) -> None:
        """Between two steps of `busy`, run one waiting batch of another model."""
        first = self.queue.take_interleavable(busy.served.model)
        if first is None:
            return
        self._timed(_live(self._fill([first])), self._run_batch)


def _live(jobs: list) -> list:
    """The jobs still wanted; the cancelled ones are settled as such."""
    for job in jobs:
        if job.cancelled:
            job.settle(error=Cancelled())
    return [job for job in jobs if not job.cancelled]


def _as_request_error(err: Exception) -> Exception:
    """A ValueError of the library (bad input it could only find while running) is the client's 422."""
    if isinstance(err, RequestError):
        return err
    if isinstance(err, ValueError):
        return RequestError(422, str(err).splitlines()[0] if str(err) else type(err).__name__,
                            param=getattr(err, "field", None))  # an OptionsError names its field
    return err
