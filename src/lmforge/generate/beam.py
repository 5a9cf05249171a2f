"""Beam search (Graves 2012; Sutskever et al. 2014, sec. 3.2) over the KV cache.

Each input keeps `num_beams` running hypotheses. Every step scores all their one-token
continuations by summed log-probability, keeps the best unfinished ones running (their
cache rows are gathered to follow them) and moves those that end in a stop token, or reach
the maximum length, into a pool of `num_beams` finished hypotheses ranked by
score / generated_length ** length_penalty (Wu et al. 2016, GNMT, sec. 7, in the simple
form the reference library uses). Stopping follows the reference library's `early_stopping`:

    True     stop an input as soon as its pool holds num_beams finished hypotheses
    False    stop when the best running score, at the current length, cannot beat the pool
    "never"  the same test, at the best length still reachable (the canonical beam search)

Scores of impossible hypotheses are a finite -1e9, combined with the same float32
arithmetic as the reference, so ties break the same way and outputs match token for token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

NEG = -1.0e9  # the score of a hypothesis that must not be chosen (finite: sums stay ordered)


@dataclass
class Beams:
    """Beam-search settings (num_beams=1: no beam search), checked by GenerationOptions."""

    num_beams: int = 1
    length_penalty: float = 1.0  # > 0 favours longer hypotheses, < 0 shorter ones
    early_stopping: Union[bool, str] = False  # True, False or "never" (see the module docstring)
    num_return_sequences: int = 1  # best hypotheses returned per input, <= num_beams


class _Pool:
    """The best finished hypotheses of each input: (B, K) scores, done flags, generated lengths."""

    def __init__(self, prompts: torch.Tensor, max_length: int, fill: int) -> None:
        B, K, T = prompts.shape
        self.seqs = torch.cat([prompts, prompts.new_full((B, K, max_length - T), fill)], dim=2)
        self.scores = torch.full((B, K), NEG, device=prompts.device)
        self.done = torch.zeros(B, K, dtype=torch.bool, device=prompts.device)
        self.lengths = torch.zeros(B, K, dtype=torch.long, device=prompts.device)

    def add(self, seqs, scores, finished, gen_len: int, open_: torch.Tensor, beams: Beams) -> None:
        """Merge candidates (B, C, L) whose `finished` flag is set; keep the K best of pool and them."""
        scores = scores / (gen_len ** beams.length_penalty)
        full = self.done.all(-1, keepdim=True) & (beams.early_stopping is True)
        scores = scores + full.float() * NEG  # an input that stopped early takes no more
        scores = scores + (~open_).float() * NEG  # nor one that can no longer improve
        scores = scores + (~finished).float() * NEG  # running candidates are not finished
        merged = torch.cat([self.scores, scores], dim=1)
        best = merged.topk(self.scores.shape[1], dim=1).indices  # (B, K)
        self.scores = merged.gather(1, best)
        self.done = torch.cat([self.done, finished], dim=1).gather(1, best)
        lengths = torch.cat([self.lengths, torch.full_like(finished, gen_len, dtype=torch.long)], dim=1)
        self.lengths = lengths.gather(1, best)
        merged_seqs = torch.cat([self.seqs, seqs], dim=1)
        self.seqs = merged_seqs.gather(1, best[..., None].expand(-1, -1, merged_seqs.shape[2]))

    def best(self, n: int, prompt_len: int) -> torch.Tensor:
        """(B * n, prompt_len + longest) the n best of each input, cut after the longest returned."""
        B, K, L = self.seqs.shape
        longest = int(self.lengths[:, :n].max())
        return self.seqs[:, :n, :prompt_len + longest].reshape(B * n, -1)


def _still_open(open_, running, pool: _Pool, length: int, beams: Beams) -> torch.Tensor:
    """(B, 1) whether the best running hypothesis (scored at `length`) may still beat the pool's worst."""
    best = running[:, :1] / (length ** beams.length_penalty)
    worst = torch.where(pool.done, pool.scores.min(-1, keepdim=True).values, NEG)
    return open_ & (best > worst).any(-1, keepdim=True)


def _candidates(logp, running, C: int):
    """The C best continuations of each input: scores (B, C), source beams (B, C), tokens (B, C)."""
    B, K = running.shape
    V = logp.shape[-1]
    total = (logp.view(B, K, V) + running[:, :, None]).view(B, K * V)
    scores, flat = total.topk(C, dim=1)
    return scores, flat // V, flat % V


@torch.no_grad()
def beam_search(steps, constraints, beams: Beams, stop, fill: int, max_new_tokens: int,
                with_scores: bool = False):
    """Decode `steps` (its rows: each input repeated num_beams times); returns (B * R, L) sequences,
    the R = num_return_sequences best per input, later positions of shorter ones `fill`; with_scores: and
    their (B * R,) scores (log-probability / length ** length_penalty; a slot no hypothesis filled: NEG)."""
    K = beams.num_beams
    N, prompt_len = steps.tokens.shape
    B, max_length = N // K, prompt_len + max_new_tokens
    C = max(2, 1 + (0 if stop is None else len(stop))) * K  # enough that K stay unfinished
    running = torch.zeros(B, K, device=steps.tokens.device)
    running[:, 1:] = NEG  # all beams start equal: only the first one's continuations count
    pool = _Pool(steps.tokens.view(B, K, -1), max_length, fill)
    open_ = torch.ones(B, 1, dtype=torch.bool, device=running.device)
    while True:
        T = steps.tokens.shape[1]
        logp = constraints(steps.logits().float().log_softmax(-1), steps.tokens)
        scores, source, tokens = _candidates(logp, running, C)
        hits = torch.isin(tokens, stop) if stop is not None else torch.zeros_like(tokens, dtype=torch.bool)
        hits |= T + 1 >= max_length
        seqs = torch.cat([steps.tokens.view(B, K, T).gather(1, source[..., None].expand(-1, -1, T)),
                          tokens[..., None], tokens.new_full((B, C, max_length - T - 1), fill)], dim=2)
        running, kept = (scores + hits.float() * NEG).topk(K, dim=1)
        top = torch.arange(C, device=hits.device) < K  # only the K best candidates may finish
        pool.add(seqs, scores, hits & top, T + 1 - prompt_len, open_, beams)
        rows = (source.gather(1, kept) + torch.arange(B, device=kept.device)[:, None] * K).view(-1)
        steps.reorder(rows)
        steps.append(tokens.gather(1, kept).view(-1))
        best_length = max_length if beams.early_stopping == "never" and beams.length_penalty > 0 else T + 1
        open_ = _still_open(open_, running, pool, best_length - prompt_len, beams)
        if not open_.any() or (beams.early_stopping is True and pool.done.all()) or hits.all():
            best = pool.best(beams.num_return_sequences, prompt_len)
            return (best, pool.scores[:, :beams.num_return_sequences].reshape(-1)) if with_scores else best
