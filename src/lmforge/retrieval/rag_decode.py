"""RAG decoding with beams (Lewis et al. 2020, sec. 2.5), on the library's beam search (generate/beam.py).

- RAG-Token: a standard beam search whose transition log-probs are the marginal
  log sum_z p(z | x) p(y_i | x, z, y_<i). Each beam row stands for its K generator rows, one per
  passage, which follow it as the search reorders and extends it (MarginalSteps), so the search itself
  is generate's, not a second one.
- RAG-Sequence: a beam search per passage under p(y | x, z) gives hypotheses Y_z; their union Y is
  ranked by p(y | x) = sum_z p(z | x) p(y | x, z). Thorough Decoding scores every y of Y under every
  passage (teacher-forced passes: RAGObjective._sequence_log_likelihoods); Fast Decoding takes
  p(y | x, z) = 0 where y is not in Y_z and reads the others' p(y | x, z) as the search scored them
  (beam_search's own scores at length_penalty 0): no pass beyond the search's own.

Hypotheses end at the stop token ([SEP], kept: p(y | x) scores the stop) or after max_new_tokens, and
are ranked by their log-probability itself (length_penalty 0): the p(y | x) the paper's decoding
maximises, so a wider beam only ever compares the same quantity.
"""
from __future__ import annotations

import math

import torch

from lmforge.config.options import checked_as
from lmforge.generate.beam import Beams, beam_search
from lmforge.generate.options import GenerationOptions
from lmforge.generate.steps import EncoderDecoderSteps
from lmforge.retrieval.rag import rag_token_next_log_probs
from lmforge.utils.errors import OptionsError

DECODINGS = ("thorough", "fast")
FILL = -1  # after a hypothesis' stop, and in pool slots no hypothesis filled: never a token id


def check_decoding(num_beams: int, decoding: str, kind: str, max_new_tokens: int = 1) -> tuple:
    """(num_beams, max_new_tokens) read and bounded as generate's GenerationOptions fields are (checked_as:
    its refusal word for word; a whole float read as its int, for the caller to decode with); an unknown
    decoding, or fast for RAG-Token, refused, naming it."""
    num_beams = checked_as(GenerationOptions, "num_beams", num_beams)
    max_new_tokens = checked_as(GenerationOptions, "max_new_tokens", max_new_tokens)
    if decoding not in DECODINGS:
        raise OptionsError(f"decoding={decoding!r} is not one of {', '.join(DECODINGS)}", "decoding")
    check_fast(decoding, kind)
    return num_beams, max_new_tokens


def check_fast(decoding: str, kind: str) -> None:
    """An OptionsError naming decoding where it is fast for RAG-Token (Fast Decoding is RAG-Sequence's)."""
    if decoding == "fast" and kind != "sequence":
        raise OptionsError("decoding='fast': Fast Decoding is RAG-Sequence's; RAG-Token decodes by beam "
                           "search over its marginal (thorough)", "decoding")


def _same(logp: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """No logit processor: the search ranks the model's own log-probabilities."""
    return logp


class MarginalSteps:
    """RAG-Token's decoding steps for generate's beam search: B * num_beams beam rows over an
    EncoderDecoderSteps of B * K * num_beams generator rows, ordered (question, passage, beam)."""

    def __init__(self, inner: EncoderDecoderSteps, doc_logp: torch.Tensor, num_beams: int) -> None:
        self.inner, self.n = inner, num_beams
        self.B, self.K = doc_logp.shape
        self.doc = doc_logp.repeat_interleave(num_beams, 0)  # (B * n, K): each beam row's p(z | x)
        device = doc_logp.device
        self.base = (torch.arange(self.B, device=device)[:, None, None] * self.K * num_beams
                     + torch.arange(self.K, device=device)[None, :, None] * num_beams)  # (B, K, 1)

    @property
    def tokens(self) -> torch.Tensor:
        """(B * n, T) each beam row's tokens (those of its first passage's row: all K are equal)."""
        return self.inner.tokens.view(self.B, self.K, self.n, -1)[:, 0].reshape(self.B * self.n, -1)

    def logits(self) -> torch.Tensor:
        """(B * n, V) log sum_z p(z | x) p(. | x, z, y_<i) of each beam row."""
        logits = self.inner.logits().view(self.B, self.K, self.n, -1).transpose(1, 2)
        return rag_token_next_log_probs(logits.reshape(self.B * self.n, self.K, -1), self.doc)

    def reorder(self, rows: torch.Tensor) -> None:
        """Beam rows `rows` (B * n,) continue: each passage's row follows its beam's source."""
        source = rows.view(self.B, self.n) % self.n  # the source beam within the question
        self.inner.reorder((self.base + source[:, None, :]).reshape(-1))

    def append(self, chosen: torch.Tensor) -> None:
        """Add (B * n,) tokens after every beam row, to each of its K passages' rows."""
        self.inner.append(chosen.view(self.B, 1, self.n).expand(-1, self.K, -1).reshape(-1))


def _steps(objective, ids, mask, num_beams: int) -> tuple:
    """(the generator's decoding steps over inputs ids, mask; the stop token [SEP]) of either search."""
    steps = EncoderDecoderSteps(objective.model, objective.lm, ids, mask, objective.start, num_beams)
    return steps, torch.tensor([objective.sep], device=ids.device)


def token_beam_search(objective, ids, mask, doc_logp, max_new_tokens: int, num_beams: int) -> torch.Tensor:
    """RAG-Token's beam search over its marginal: (B * K, S) generator inputs -> (B, 1 + n) decoder
    ids of each question's best hypothesis, the start first, FILL after its stop."""
    inner, stop = _steps(objective, ids, mask, num_beams)
    steps = MarginalSteps(inner, doc_logp, num_beams)
    return beam_search(steps, _same, Beams(num_beams, 0.0, False, 1), stop, FILL, max_new_tokens)


def passage_beams(objective, ids, mask, K: int, max_new_tokens: int, num_beams: int) -> list:
    """Each passage's beam (RAG-Sequence): per question, per passage, {hypothesis: log p(y | x, z)},
    best first, each hypothesis a tuple ending at its first stop (kept) or after max_new_tokens."""
    sep = objective.sep
    steps, stop = _steps(objective, ids, mask, num_beams)
    # length_penalty 0: the search's own score of a hypothesis is its log p(y | x, z), no further pass
    beams = Beams(num_beams, 0.0, False, num_beams)
    out, scores = beam_search(steps, _same, beams, stop, FILL, max_new_tokens, with_scores=True)
    found = [{} for _ in range(len(ids))]
    for i, (row, score) in enumerate(zip(out[:, 1:].tolist(), scores.tolist())):
        y = tuple(row[:row.index(sep) + 1] if sep in row else row)
        if y and y[0] != FILL and y not in found[i // num_beams]:  # FILL: a slot no hypothesis reached
            found[i // num_beams][y] = score
    return [found[b * K:(b + 1) * K] for b in range(len(ids) // K)]


def fast_scores(beams: list, doc_logp: torch.Tensor) -> tuple:
    """Fast Decoding of one question: its K passages' beams and (K,) log p(z | x) -> (the union's
    hypotheses, first seen first; (C,) log sum_{z: y in Y_z} p(z | x) p(y | x, z))."""
    candidates = list(dict.fromkeys(y for beam in beams for y in beam))
    # (C, K) log p(y | x, z), -inf (p = 0) where y is off passage z's beam: one logsumexp for the union
    joint = torch.tensor([[beam.get(y, -math.inf) for beam in beams] for y in candidates],
                         dtype=torch.float64)
    return candidates, torch.logsumexp(joint + doc_logp.detach().to("cpu", torch.float64), 1)
