"""RAG marginalisation over the top-k retrieved passages (Lewis et al. 2020, sec. 2.1).

With the retriever's passage distribution p_eta(z | x) = softmax_z(d(z)^T q(x)) over the top k and a
generator p_theta(y_i | x, z, y_<i) run once per passage:

- RAG-Sequence: p(y | x) = sum_z p_eta(z | x) prod_i p_theta(y_i | x, z, y_<i)        (eq. 1)
- RAG-Token:    p(y | x) = prod_i sum_z p_eta(z | x) p_theta(y_i | x, z, y_<i)        (eq. 2)

Everything is computed in log space (logsumexp), so long answers do not underflow. Token log-probs
come as (B, K, T, V) generator logits for B questions, K passages, T target positions; targets
(B, T) hold the answer ids, IGNORE (-100) where padded. Gradients reach the question encoder
through p_eta (the passage embeddings stay fixed, as in the paper). Decoding (sec. 2.5: RAG-Token's beam
search over rag_token_next_log_probs, RAG-Sequence's Thorough and Fast Decoding) is rag_decode.py's.
"""
from __future__ import annotations

import torch

IGNORE = -100


def passage_log_probs(question: torch.Tensor, passages: torch.Tensor) -> torch.Tensor:
    """log p_eta(z | x): (B, d) questions, (B, K, d) their retrieved passages -> (B, K)."""
    scores = torch.einsum("bd,bkd->bk", question, passages)  # inner products d(z)^T q(x)
    return torch.log_softmax(scores.float(), dim=-1)


def _target_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> tuple:
    """(B, K, T, V) logits, (B, T) targets -> ((B, K, T) log p_theta(y_i | x, z, y_<i), 0 where
    padded; (B, T) mask of real positions)."""
    mask = targets != IGNORE
    index = targets.clamp(min=0)[:, None, :, None].expand(-1, logits.shape[1], -1, 1)  # (B, K, T, 1)
    token = torch.log_softmax(logits.float(), -1).gather(-1, index).squeeze(-1)
    return token.masked_fill(~mask[:, None, :], 0.0), mask


def rag_sequence_log_likelihood(logits: torch.Tensor, targets: torch.Tensor,
                                doc_log_probs: torch.Tensor) -> torch.Tensor:
    """log p(y | x) under RAG-Sequence (eq. 1): (B,) per question."""
    token, _ = _target_log_probs(logits, targets)
    return torch.logsumexp(doc_log_probs + token.sum(-1), dim=-1)  # sum over z of p(z) prod_i p(y_i)


def rag_token_log_likelihood(logits: torch.Tensor, targets: torch.Tensor,
                             doc_log_probs: torch.Tensor) -> torch.Tensor:
    """log p(y | x) under RAG-Token (eq. 2): (B,) per question."""
    token, mask = _target_log_probs(logits, targets)
    per_position = torch.logsumexp(doc_log_probs[:, :, None] + token, dim=1)  # (B, T): sum over z per token
    return (per_position * mask).sum(-1)


def rag_token_next_log_probs(logits: torch.Tensor, doc_log_probs: torch.Tensor) -> torch.Tensor:
    """RAG-Token's marginal next-token distribution for decoding: (B, K, V) logits at one step ->
    (B, V) log sum_z p(z | x) p_theta(. | x, z, y_<i)."""
    return torch.logsumexp(doc_log_probs[:, :, None] + torch.log_softmax(logits.float(), -1), dim=1)


def rag_loss(logits: torch.Tensor, targets: torch.Tensor, doc_log_probs: torch.Tensor,
             kind: str = "sequence") -> torch.Tensor:
    """Mean negative log-likelihood of the answers under RAG-Sequence or RAG-Token."""
    if kind not in ("sequence", "token"):
        raise ValueError(f"kind={kind!r} is not one of sequence, token")
    fn = rag_sequence_log_likelihood if kind == "sequence" else rag_token_log_likelihood
    return -fn(logits, targets, doc_log_probs).mean()
