"""Shared by these tests: `decoder`, a tiny GPT-2 with an LM head and the gpt2 tokenizer it reads with."""
from __future__ import annotations

import pytest
import torch

import lmforge
from lmforge.heads import attach
from tests.tasks.core import tokenizer


@pytest.fixture(scope="module")
def decoder():
    """(model, tokenizer): an untrained tiny gpt2 (seed 0) with an LM head, and gpt2's tokenizer."""
    tok = tokenizer("gpt2")
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("gpt2", vocab_size=tok.vocab_size))
    attach(model, "lm")
    return model, tok
