"""The worker threads' jobs and the queue they wait on: what a request becomes once it is parsed.

A Job is settled on the event loop through its future (results, streamed events and errors pass back
with call_soon_threadsafe); the JobQueue is the FIFO between the event loop (put) and the workers
(take), with the wake-ups described on it.
"""
from __future__ import annotations

import collections
import threading
import time


class Job:
    """One unit of the worker's work; settled on the event loop through its future."""

    def __init__(self, kind: str, served, payload: dict, tokens: int, size: int, loop, events=None,
                 key: tuple | None = None, interleave: bool = False) -> None:
        self.kind, self.served, self.payload, self.tokens, self.size = kind, served, payload, tokens, size
        self.loop, self.events, self.future = loop, events, loop.create_future()
        self.key = key  # jobs with the same key may share a forward pass; None: runs alone
        self.interleave = interleave  # forward passes only: may run between another model's decoding steps
        self.cancelled, self.steps, self.steps_at_cancel = False, 0, 0
        self.enqueued = time.perf_counter()

    def cancel(self) -> None:
        """Ask the worker to drop the job (called from the event loop when the client goes)."""
        self.steps_at_cancel, self.cancelled = self.steps, True
        self.future.add_done_callback(_retrieve)  # nobody awaits it now: its Cancelled is expected

    def _call(self, fn, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop has closed: nobody is waiting any more
            pass

    def emit(self, event: dict) -> None:
        """Pass a streamed event to the event loop."""
        if self.events is not None:
            self._call(self.events.put_nowait, event)

    def settle(self, result=None, error: BaseException | None = None) -> None:
        """Hand the result (or the error) to the waiting request."""
        self._call(_settle, self.future, result, error)


def _retrieve(future) -> None:
    """Mark an abandoned job's error as seen (asyncio logs a traceback for an error never retrieved)."""
    if not future.cancelled():
        future.exception()


def _settle(future, result, error) -> None:
    if future.done():  # the request was abandoned
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class JobQueue:
    """A FIFO of jobs shared by the event loop (put) and the workers (take); close() ends takes.

    Wake-ups: the first worker (every kind of job), the batch-only workers and a worker holding a
    batch open (batch_wait_ms) wait on three conditions of one lock, so a job wakes one thread that
    may take it, not every worker (one per core by default: 64 wake-ups a request on 64 cores).
    take()'s waits must stay untimed: a notify() that reaches a waiter whose timeout has just run out
    is lost, and with it the wake-up of a job."""

    def __init__(self) -> None:
        self._jobs: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._any, self._batched, self._arrived = (threading.Condition(self._lock) for _ in range(3))
        self._items = 0  # texts of the queued jobs, kept as they come and go
        self.closed = False

    def __len__(self) -> int:
        return len(self._jobs)

    def items(self) -> int:
        """Texts (or records) of the queued jobs, all together."""
        return self._items

    def put(self, job: Job) -> None:
        """Queue a job and wake one worker that may take it (and any worker holding a batch open)."""
        with self._lock:
            self._jobs.append(job)
            self._items += job.size
            if job.key is None:  # only the first worker runs it
                self._any.notify()
            else:  # the first worker may be busy with a generation: one batch-only worker too
                self._batched.notify()
                self._any.notify()
                self._arrived.notify_all()

    def _remove(self, job: Job) -> Job:
        self._jobs.remove(job)
        self._items -= job.size
        return job

    def take(self, batched_only: bool = False) -> Job | None:
        """The oldest job (batched_only: the oldest batchable one), waiting for one; None once closed
        and nothing it may take is left (the drain is over)."""
        ready = self._batched if batched_only else self._any
        with self._lock:
            while True:
                job = next((j for j in self._jobs if j.key is not None), None) if batched_only \
                    else (self._jobs[0] if self._jobs else None)
                if job is not None:
                    return self._remove(job)
                if self.closed:
                    return None
                ready.wait()

    def take_similar(self, key: tuple, tokens: int, items: int) -> list:
        """Queued jobs of `key`, oldest first, while they fit `tokens` and `items`."""
        found = []
        with self._lock:
            for job in list(self._jobs):
                if job.key == key and job.tokens <= tokens and job.size <= items:
                    found.append(self._remove(job))
                    tokens, items = tokens - job.tokens, items - job.size
        return found

    def take_interleavable(self, busy_model) -> Job | None:
        """The oldest batchable job of a model other than `busy_model`, or None."""
        with self._lock:
            for job in self._jobs:
                if job.interleave and job.served.model is not busy_model:
                    return self._remove(job)
        return None

    def wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, waking when a batchable job arrives."""
        with self._lock:
            self._arrived.wait(seconds)

    def close(self) -> None:
        """Let take() return None once the queue is empty."""
        with self._lock:
            self.closed = True
            for ready in (self._any, self._batched, self._arrived):
                ready.notify_all()
