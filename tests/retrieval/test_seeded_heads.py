"""A head a retrieval objective adds (the reader's span and selection heads, REALM's and RAG's LM head)
is drawn from the run's seed: the same seed gives the same head whatever the global RNG held, another
seed another head, and the caller's RNG is left as it was."""
from __future__ import annotations

import copy

import pytest
import torch

import lmforge
from lmforge.retrieval.dpr import BiEncoder, EncoderOptions, passage_text
from lmforge.retrieval.passages import load_passages
from lmforge.retrieval.rag_train import RAGObjective
from lmforge.retrieval.reader import ExtractiveReader
from lmforge.retrieval.realm import REALMObjective
from lmforge.tokenizer.train import train_tokenizer


@pytest.fixture(scope="module")
def parts():
    passages = load_passages(None)[:12]
    tok = train_tokenizer([passage_text(p) for p in passages], "wordpiece", 200)
    torch.manual_seed(0)
    bert = lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=tok.vocab_size,
                         max_seq_len=64)
    bart = lmforge.build(lmforge.tiny("bart-base"), vocab_size=tok.vocab_size, max_seq_len=64,
                         decoder_start_token_id=tok.special_id("cls"), pad_token_id=tok.special_id("pad"))
    return passages, tok, bert, bart


def _reader(parts, seed):
    _, tok, bert, _ = parts
    return ExtractiveReader(copy.deepcopy(bert), tok, max_len=64, seed=seed)


def _realm(parts, seed):
    passages, tok, bert, _ = parts
    retriever = BiEncoder(copy.deepcopy(bert), tok, EncoderOptions(max_length=32))
    return REALMObjective(copy.deepcopy(bert), retriever, passages, k=1, max_len=64, seed=seed)


def _rag(parts, seed):
    passages, tok, bert, bart = parts
    retriever = BiEncoder(copy.deepcopy(bert), tok, EncoderOptions(max_length=32))
    return RAGObjective(copy.deepcopy(bart), retriever, torch.zeros(len(passages), 32), [[5]] * len(passages),
                        k=1, seed=seed)


def _heads(objective) -> dict:
    """The new heads' weights (the backbones are copies of one model)."""
    names = ("span", "select") if isinstance(objective, ExtractiveReader) else ("lm",)
    return {f"{n}.{k}": v for n in names for k, v in getattr(objective, n).state_dict().items()}


@pytest.mark.parametrize("make", [_reader, _realm, _rag], ids=["reader", "realm", "rag"])
def test_new_heads_come_from_the_seed_not_the_global_rng(parts, make):
    torch.manual_seed(1)
    first = _heads(make(parts, seed=7))
    torch.manual_seed(2)
    torch.rand(5)  # the global RNG somewhere else entirely
    again = _heads(make(parts, seed=7))
    other = _heads(make(parts, seed=8))
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    # BART's tied LM head: a zero bias
    drawn = [k for k in first if first[k].numel() > 1 and first[k].std() > 0]
    assert not drawn or any(not torch.equal(first[k], other[k]) for k in drawn)
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    make(parts, seed=7)
    assert torch.equal(torch.rand(3), expected)  # the caller's RNG was not consumed
