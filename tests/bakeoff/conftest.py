"""A tiny plan: two arms of a one-layer encoder on the built-in corpus, one built-in task."""
from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.tasks.core import no_loss_plot  # noqa: F401  (an autouse fixture: no loss.png drawn)

# budget: 60+ steps an arm, on any of the tests' texts within the 2 % the schedules allow (at 4e8, 19-28
# steps once the count charged the unpadded encoders, rounding put ELECTRA 2.5 % off)
TINY_MODEL = {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64}
TINY = {"name": "tiny", "budget": 1.2e9, "corpus": {"source": "builtin", "documents": 120},
        "tokenizer": {"family": "bert", "vocab_size": 300},
        "pretrain": {"max_len": 32, "batch_size": 8, "lr": 1e-3, "warmup": 2},
        "finetune": {"steps": 6, "batch_size": 8, "lr": 1e-3, "warmup": 0, "max_len": 32},
        "tasks": [{"name": "sentiment", "source": "builtin", "n": 40}], "seeds": [0],
        "arms": [{"name": "mlm", "objective": "mlm", "preset": "bert-tiny", "overrides": TINY_MODEL},
                 {"name": "electra", "objective": "rtd", "preset": "bert-tiny", "options": {"ratio": 0.5},
                  "overrides": TINY_MODEL}],
        "claims": [{"better": "electra", "worse": "mlm", "task": "sentiment"}]}


@pytest.fixture
def tiny_plan() -> dict:
    """A fresh copy of the tiny plan's mapping (tests change it)."""
    return copy.deepcopy(TINY)


@pytest.fixture
def hash_reads(monkeypatch) -> dict:
    """file name -> how many times bakeoff.results hashed it (a full read), from a process with nothing
    hashed yet."""
    from lmforge.bakeoff import results

    reads: dict = {}
    hashed = results.sha256

    def counting(path):
        reads[Path(path).name] = reads.get(Path(path).name, 0) + 1
        return hashed(path)

    monkeypatch.setattr(results, "sha256", counting)
    monkeypatch.setattr(results, "_HASHED", {})
    return reads


@pytest.fixture
def settled(monkeypatch) -> None:
    """bakeoff.results' clock an hour on: the files a test wrote have stood still a while, as a corpus
    written long before the run has (their ctime, which no test can set back, is what is read)."""
    from lmforge.bakeoff import results

    now = results.time.time_ns
    monkeypatch.setattr(results, "time", SimpleNamespace(time_ns=lambda: now() + 3600 * 10 ** 9))


class _NoTracker:
    """FlopCounterMode's module tracker without the global forward hooks it registers: lmforge's execution
    keeps the padded layout wherever a hook watches (fast/execution.py), so with them the trainer's unpadding
    never ran under the counter. Every count goes to "Global", which get_total_flops reads."""

    parents = {"Global"}

    def __enter__(self):
        return self

    def __exit__(self, *args) -> None:
        return None


def trained_flops(objective, batch: dict) -> int:
    """FLOPs of one training step (forward and backward) of `objective` on `batch` as the trainer runs it:
    lmforge.optimize's execution (unpadding), training mode, counted by FlopCounterMode without its hooks, its
    attention by SDPA's math path (the same products)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from lmforge.fast.optimize import optimize

    optimize(objective.train())
    counter = FlopCounterMode(display=False)
    counter.mod_tracker = _NoTracker()
    try:  # SDPA's math path: the counter has no formula for the CPU's fused kernel (no dropout) and skips it
        with counter, sdpa_kernel(SDPBackend.MATH):
            objective(batch).loss.backward()
    finally:
        optimize(objective, enabled=False)
        objective.zero_grad(set_to_none=True)
    return counter.get_total_flops()
