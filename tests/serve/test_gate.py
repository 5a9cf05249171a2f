"""serve.gate: batches share a model, a job that changes it runs alone, and a waiting one is not starved."""
from __future__ import annotations

import threading
import time

from lmforge.serve.gate import ModelGate, gate_of


def _hold(context, entered: list, name: str, release: threading.Event) -> threading.Thread:
    def run():
        with context:
            entered.append(name)
            release.wait(10)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_batches_share_and_an_exclusive_job_waits_for_them_then_runs_before_new_batches():
    gate, entered = ModelGate(), []
    first, second, alone, late = (threading.Event() for _ in range(4))
    threads = [_hold(gate.shared(), entered, "batch 1", first),
               _hold(gate.shared(), entered, "batch 2", second)]
    time.sleep(0.1)
    assert sorted(entered) == ["batch 1", "batch 2"]  # side by side
    threads.append(_hold(gate.exclusive(), entered, "view", alone))
    time.sleep(0.1)
    threads.append(_hold(gate.shared(), entered, "batch 3", late))  # behind the waiting view
    first.set()
    time.sleep(0.1)
    assert "view" not in entered  # batch 2 still holds the model
    second.set()
    time.sleep(0.1)
    assert entered[-1] == "view" and "batch 3" not in entered  # alone, and before the newer batch
    alone.set()
    late.set()
    for thread in threads:
        thread.join(10)
    assert entered[-1] == "batch 3"


def test_one_gate_per_model():
    a, b = object.__new__(type("M", (), {})), object.__new__(type("M", (), {}))
    assert gate_of(a) is gate_of(a) and gate_of(a) is not gate_of(b)
