"""RAG-Sequence and RAG-Token against a hand computation: two passages, known probabilities."""
from __future__ import annotations

import math

import pytest
import torch

from lmforge.retrieval.rag import (IGNORE, passage_log_probs, rag_loss, rag_sequence_log_likelihood,
                                   rag_token_log_likelihood, rag_token_next_log_probs)

# p(z1 | x) = 0.6, p(z2 | x) = 0.4; answer y = (token 0, token 1) over a vocabulary of 2
# passage z1: p(y1 = 0) = 0.9, p(y2 = 1 | y1) = 0.5;   passage z2: p(y1 = 0) = 0.2, p(y2 = 1 | y1) = 0.7
DOC = torch.log(torch.tensor([[0.6, 0.4]]))
PROBS = torch.tensor([[[[0.9, 0.1], [0.5, 0.5]], [[0.2, 0.8], [0.3, 0.7]]]])  # (B=1, K=2, T=2, V=2)
LOGITS = PROBS.log()  # log-softmax of log-probabilities gives them back
TARGET = torch.tensor([[0, 1]])


def test_rag_sequence_is_the_hand_computation():
    # 0.6 * (0.9 * 0.5) + 0.4 * (0.2 * 0.7) = 0.27 + 0.056
    got = rag_sequence_log_likelihood(LOGITS, TARGET, DOC)
    assert got.exp().item() == pytest.approx(0.326, abs=1e-6)


def test_rag_token_is_the_hand_computation():
    # (0.6 * 0.9 + 0.4 * 0.2) * (0.6 * 0.5 + 0.4 * 0.7) = 0.62 * 0.58
    got = rag_token_log_likelihood(LOGITS, TARGET, DOC)
    assert got.exp().item() == pytest.approx(0.3596, abs=1e-6)
    assert rag_loss(LOGITS, TARGET, DOC, "token").item() == pytest.approx(-math.log(0.3596), abs=1e-6)


def test_next_token_marginal_and_padding():
    # first step: p(0) = 0.62, p(1) = 0.38, a distribution
    assert torch.allclose(rag_token_next_log_probs(LOGITS[:, :, 0], DOC).exp(), torch.tensor([[0.62, 0.38]]))
    padded = torch.cat([LOGITS, torch.randn(1, 2, 1, 2)], dim=2)  # a third, padded position
    target = torch.tensor([[0, 1, IGNORE]])
    assert rag_sequence_log_likelihood(padded, target, DOC).exp().item() == pytest.approx(0.326, abs=1e-6)
    assert rag_token_log_likelihood(padded, target, DOC).exp().item() == pytest.approx(0.3596, abs=1e-6)


def test_with_one_passage_both_are_the_generator_likelihood_and_gradients_reach_the_question():
    question = torch.randn(3, 8, requires_grad=True)
    passages = torch.randn(3, 4, 8)
    doc = passage_log_probs(question, passages)
    assert torch.allclose(doc.exp().sum(-1), torch.ones(3))
    logits, target = torch.randn(3, 4, 5, 7), torch.randint(0, 7, (3, 5))
    rag_loss(logits, target, doc, "sequence").backward()
    assert question.grad is not None and question.grad.abs().sum() > 0
    one = torch.zeros(3, 1)
    seq = rag_sequence_log_likelihood(logits[:, :1], target, one)
    tok = rag_token_log_likelihood(logits[:, :1], target, one)
    plain = torch.log_softmax(logits[:, 0], -1).gather(-1, target[..., None]).squeeze(-1).sum(-1)
    assert torch.allclose(seq, plain, atol=1e-5) and torch.allclose(tok, plain, atol=1e-5)
