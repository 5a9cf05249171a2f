"""A tiny plan: two arms of a one-layer encoder on the built-in corpus, one built-in task."""
from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.tasks.core import no_loss_plot  # noqa: F401  (an autouse fixture: no loss.png drawn)

TINY_MODEL = {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64}
TINY = {"name": "tiny", "budget": 4.0e8, "corpus": {"source": "builtin", "documents": 120},
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
