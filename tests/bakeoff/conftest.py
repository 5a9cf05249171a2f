"""A tiny plan: two arms of a one-layer encoder on the built-in corpus, one built-in task."""
from __future__ import annotations

import copy

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
