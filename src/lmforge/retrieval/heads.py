"""Heads a retrieval objective starts untrained when its model has none (the reader's span and
selection heads, REALM's and RAG's LM head): drawn from the run's seed, on fine-tuning's head stream
(tasks/finetune.py HEAD_SEED), so a seed fixes a run's start whatever the caller's RNG holds."""
from __future__ import annotations

from contextlib import contextmanager

import torch

from lmforge.heads import make_head
from lmforge.tasks.finetune import HEAD_SEED
from lmforge.train.data import derive_seed


@contextmanager
def seeded_heads(seed: int):
    """Draw every head made inside from the run's seed, leaving the caller's RNG as it was."""
    with torch.random.fork_rng(devices=[]):  # heads are made on the CPU, beside the loaded model
        torch.manual_seed(derive_seed(seed, HEAD_SEED))
        yield


def head_or_new(model, name: str, kind: str, **args):
    """model.heads[name] if the model has it (trained before), else a fresh `kind` head (draw it inside
    seeded_heads)."""
    return model.heads[name] if name in model.heads else make_head(model, kind, **args)
