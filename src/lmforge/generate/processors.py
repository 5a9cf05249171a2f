"""Logit processors: rules that reshape next-token scores before a token is chosen.

The repetition penalty of Keskar et al. (2019, CTRL sec. 4.1), n-gram blocking (Paulus et
al. 2018, "A Deep Reinforced Model for Abstractive Summarization", sec. 2.5), a minimum
length (eos suppressed until then), tokens forced at the first and the last position
(BART/mBART checkpoints force bos and eos there) and suppressed tokens. They apply to logits
for greedy decoding and sampling and to log-probabilities for beam search, in the order
the reference library applies them, so outputs match it token for token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

NEG_INF = float("-inf")


def penalise_repetition(scores: torch.Tensor, seen: torch.Tensor, penalty: float,
                        ignore: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Divide positive (multiply negative) scores of tokens in `seen` by `penalty`, once per token.

    scores (B, V); seen (B, T) token ids so far; ignore (B, T) True where a position is not
    text (left padding) and does not count."""
    V = scores.shape[-1]
    ids = seen if ignore is None else seen.masked_fill(ignore, V)  # ignored ids go to a spare column
    hit = torch.zeros(scores.shape[0], V + 1, dtype=torch.bool, device=scores.device)
    hit = hit.scatter(1, ids, True)[:, :V]
    penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(hit, penalised, scores)


def ban_repeated_ngrams(scores: torch.Tensor, seen: torch.Tensor, n: int) -> torch.Tensor:
    """Forbid each token that would complete an n-gram already in `seen` (B, T)."""
    T = seen.shape[1]
    if T < n:
        return scores
    V = scores.shape[-1]
    windows = seen.unfold(1, n, 1)  # (B, T - n + 1, n) every n-gram so far
    suffix = seen[:, T - n + 1:]  # (B, n - 1) what the next token would extend
    repeats = (windows[..., :-1] == suffix[:, None]).all(-1)  # (B, W) n-grams that start like the suffix
    banned = torch.zeros(scores.shape[0], V + 1, dtype=torch.bool, device=scores.device)
    banned = banned.scatter(1, torch.where(repeats, windows[..., -1], V), True)[:, :V]
    return scores.masked_fill(banned, NEG_INF)


def force(scores: torch.Tensor, token: int) -> torch.Tensor:
    """Scores that allow only `token` (log-probability 0, everything else -inf)."""
    forced = torch.full_like(scores, NEG_INF)
    forced[:, token] = 0
    return forced


@dataclass
class Constraints:
    """The processors of one generate() call; `prompt_len` and `max_length` count the decoder's
    tokens (decoders: prompt with its padding; encoder-decoders: the start token)."""

    prompt_len: int
    max_length: int
    eos: Optional[torch.Tensor] = None  # (E,) stop ids: suppressed until the minimum length
    repetition_penalty: float = 1.0
    padding: Optional[torch.Tensor] = None  # (N,) left-padding length of each row (not penalised)
    no_repeat_ngram_size: int = 0
    min_length: int = 0  # of the whole decoder sequence, prompt included
    min_new_tokens: int = 0
    forced_bos_token_id: Optional[int] = None
    forced_eos_token_id: Optional[int] = None
    suppress_tokens: Optional[torch.Tensor] = None  # (S,) ids never generated

    def __call__(self, scores: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """(N, V) scores of the next position given the (N, T) tokens so far."""
        T = seen.shape[1]
        if self.repetition_penalty != 1.0:
            ignore = None
            if self.padding is not None:
                ignore = torch.arange(T, device=seen.device)[None] < self.padding[:, None]
            scores = penalise_repetition(scores, seen, self.repetition_penalty, ignore)
        if self.no_repeat_ngram_size:
            scores = ban_repeated_ngrams(scores, seen, self.no_repeat_ngram_size)
        if self._too_short(T):
            scores = scores.index_fill(1, self.eos, NEG_INF)
        if self._forces_bos(T):
            scores = force(scores, self.forced_bos_token_id)
        if self._forces_eos(T):
            scores = force(scores, self.forced_eos_token_id)
        if self.suppress_tokens is not None:
            scores = scores.index_fill(1, self.suppress_tokens, NEG_INF)
        return scores

    @property
    def always_active(self) -> bool:
        """Whether some processor changes the scores at every step (penalty, n-gram ban, suppression)."""
        return (self.repetition_penalty != 1.0 or bool(self.no_repeat_ngram_size)
                or self.suppress_tokens is not None)

    def inert(self, T: int) -> bool:
        """Whether the call at sequence length T returns the scores unchanged (greedy decoding may
        then take the argmax of the raw logits without computing all of them: vocab_screen.py)."""
        return not (self.always_active or self._too_short(T) or self._forces_bos(T) or self._forces_eos(T))

    def _too_short(self, T: int) -> bool:
        return self.eos is not None and (T < self.min_length or T - self.prompt_len < self.min_new_tokens)

    def _forces_bos(self, T: int) -> bool:
        return self.forced_bos_token_id is not None and T == 1

    def _forces_eos(self, T: int) -> bool:
        return self.forced_eos_token_id is not None and T == self.max_length - 1
