"""A model folder whose generation_config.json is a FIFO, and a guard that fails a read waiting on it."""
from __future__ import annotations

import contextlib
import os
import signal

import lmforge


def hf_folder_with_fifo(folder, **shape):
    """A Hugging Face bert-base folder of `shape` at `folder` whose generation_config.json is a named pipe
    (a reader of it blocks for ever)."""
    lmforge.build("bert-base", **shape).save(folder, format="hf")
    os.mkfifo(folder / "generation_config.json")
    return folder


@contextlib.contextmanager
def not_waiting(seconds: int = 5):
    """The block, ended by a TimeoutError should it wait `seconds` (on a FIFO) instead of refusing."""
    def alarm(*args):
        raise TimeoutError("waited on the FIFO")

    before = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
