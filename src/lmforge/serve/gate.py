"""Shared and exclusive use of one model by several workers (worker.py).

Batches (embeddings, predictions) of one model may run in two workers at once: a forward pass changes
nothing on the model. A job that does change it while it runs may not share it: the attention view sets
`model.inspection`, which every forward pass of that model reads, so a batch beside it would record
into the view (another client's attention under this request's tokens) and run the slow recording path.
Such a job waits for the model's running batches, and batches wait for it (and for one that is waiting:
a steady stream of batches never starves it).
"""
from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager


class ModelGate:
    """A readers-writer lock with the writer preferred: shared() for batches, exclusive() for the rest."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._shared = self._waiting = 0
        self._exclusive = False

    @contextmanager
    def shared(self):
        """Run beside other shared users; not beside an exclusive one, nor before one that waits."""
        with self._changed:
            while self._exclusive or self._waiting:
                self._changed.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._changed:
                self._shared -= 1
                self._changed.notify_all()

    @contextmanager
    def exclusive(self):
        """Run alone, once the shared users that hold the model have finished."""
        with self._changed:
            self._waiting += 1
            try:
                while self._exclusive or self._shared:
                    self._changed.wait()
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._changed:
                self._exclusive = False
                self._changed.notify_all()


_GATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_MADE = threading.Lock()


def gate_of(model) -> ModelGate:
    """The one gate of `model` (made on first use)."""
    with _MADE:
        gate = _GATES.get(model)
        if gate is None:
            gate = _GATES[model] = ModelGate()
        return gate
