"""SpanBERT: span masking and the span boundary objective (Joshi et al. 2020, sec. 3.1-3.2).

Span masking (sec. 3.1) selects contiguous spans of whole words instead of single
tokens: a length l (in words) is drawn from Geo(p = 0.2) truncated to 1..10 and
renormalised — mean 3.80 words, the paper's l-bar = 3.8 (clipping the tail mass onto 10
instead would give 4.46) — and a start uniformly among the word starts where l whole
words fit, until 15 % of the tokens are selected (the span that would cross the budget is
kept whole with probability remaining budget / its size, so the expected selection is
exactly 15 % and every span has its drawn length; this stop favours short spans a little:
3.6 words on average in 128-token sequences, 3.77 in 1000-token ones). 80/10/10 is
decided once per span: all its tokens become [MASK], all random tokens, or all stay.

The span boundary objective (sec. 3.2) predicts each token x_i of a span (s, e) from
the encoder states of the two boundary tokens x_{s-1}, x_{e+1} and a relative position
embedding p_{i-s+1} (eq. 1-2), projected with the MLM's output embedding ("exactly like the
MLM objective": the token table where it is tied, the LM head's decoder where it is not); the loss
adds it to MLM at every selected position. So the boundaries are always observed tokens, spans
never overlap or touch, and never include a sequence's first or last position.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.data.stream import ExampleFormat
from lmforge.model import init_weights
from lmforge.objectives.base import IGNORE, Loss, top1_accuracy, within
from lmforge.objectives.mlm import MaskedLM, budget, words
from lmforge.objectives.registry import ObjectiveSpec, register


def length_distribution(p: float = 0.2, max_words: int = 10) -> torch.Tensor:
    """P(l) proportional to p (1-p)^(l-1) for l = 1..max_words: Geo(p) truncated and renormalised."""
    lengths = torch.arange(1, max_words + 1, dtype=torch.float64)
    weights = p * (1 - p) ** (lengths - 1)
    return weights / weights.sum()


def reach(groups: list, taken: list) -> list:
    """Per word: how many contiguous words from it can join a new span (0: it cannot).

    A word qualifies when it is free, both its neighbouring positions exist and are
    free too, so every span keeps two observed boundary tokens. (Spans hold whole
    words, so a word's first position tells whether it is taken.)"""
    out, T = [0] * len(groups), len(taken)
    for w in range(len(groups) - 1, -1, -1):
        first, last = groups[w][0], groups[w][-1]
        if first < 1 or last > T - 2 or taken[first - 1] or taken[first] or taken[last + 1]:
            continue
        follows = w + 1 < len(groups) and groups[w + 1][0] == last + 1
        out[w] = 1 + (out[w + 1] if follows else 0)
    return out


def select_spans(groups: list, n: int, T: int, lengths: torch.Tensor, generator: torch.Generator) -> list:
    """Non-overlapping spans of whole words until n tokens are selected; (first, last) positions."""
    taken, selected, spans = [False] * T, 0, []
    while selected < n:
        fits = reach(groups, taken)
        longest = min(max(fits, default=0), len(lengths))
        if longest == 0:  # no room left for any span: the budget cannot be met
            break
        # the length distribution cut to what still fits (all of it in any long sequence)
        length = int(torch.multinomial(lengths[:longest], 1, generator=generator)) + 1
        starts = [w for w, r in enumerate(fits) if r >= length]
        w = starts[int(torch.randint(len(starts), (), generator=generator))]
        first, last = groups[w][0], groups[w + length - 1][-1]
        size, left = last - first + 1, n - selected
        # the span that crosses the budget is kept whole with probability left / size: the
        # expected number selected is exactly n, and no span is ever cut short of its length
        if size > left and float(torch.rand((), generator=generator)) >= left / size:
            break
        taken[first:last + 1] = [True] * size
        selected += size
        spans.append((first, last))
    return spans


class SpanBoundaryHead(nn.Module):
    """The SBO's f (eq. 1-2): h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}], h1 = LayerNorm(GeLU(W1 h0)),
    y_i = LayerNorm(GeLU(W2 h1)), then vocabulary logits with the output embedding and a bias of its own."""

    def __init__(self, model: nn.Module, width: int | None = None) -> None:
        super().__init__()
        cfg = model.config
        # E: the output embedding's width (the token table's, or an untied decoder's without a transform)
        d, E = cfg.d_model, width or cfg.embed_dim
        self.positions = nn.Embedding(cfg.max_seq_len, d)  # p_1 .. p_T: no span is longer than T
        self.W1 = nn.Linear(3 * d, d)
        self.norm1 = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.W2 = nn.Linear(d, E)  # to the output embedding's width (ALBERT-style factorised tables)
        self.norm2 = nn.LayerNorm(E, eps=cfg.norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, left: torch.Tensor, right: torch.Tensor, pos: torch.Tensor,
                table: torch.Tensor) -> torch.Tensor:
        """left, right (N, d) boundary states, pos (N,) 1-based, table (V, E) -> logits (N, V)."""
        h0 = torch.cat([left, right, self.positions(pos - 1)], dim=-1)  # (N, 3d)
        h1 = self.norm1(F.gelu(self.W1(h0)))
        y = self.norm2(F.gelu(self.W2(h1)))  # (N, E)
        return F.linear(y, table, self.bias)


class SpanMLM(MaskedLM):
    """SpanBERT's pretraining: span masking, masked LM plus the span boundary objective."""

    name = "span"
    # a span no longer than a sequence holds (its length table has max_words rows); whole words always
    bounds = {**MaskedLM.bounds, "p": within(0, 1, above=True), "max_words": within(1, 512, integer=True)}
    fixed = ("whole_word",)
    all_used = False  # a batch with no span (short sequences) runs neither the LM head nor the SBO

    def __init__(self, model, mask_id: int, p: float = 0.2, max_words: int = 10, **mlm) -> None:
        super().__init__(model, mask_id, whole_word=True, **mlm)
        self.check_values(dict(p=p, max_words=max_words))
        self.lengths = length_distribution(p, max_words)
        # the SBO head is not in the core head registry (it needs span boundaries, not just
        # hidden states), so it stays with the objective: in training checkpoints, not in
        # the kept model, which SpanBERT also drops after pretraining
        self.sbo = SpanBoundaryHead(model, self.output_embedding().shape[1])
        init_weights(self.sbo)

    def output_embedding(self) -> torch.Tensor:
        """The (V, E) table the MLM predicts with, which the SBO shares (sec. 3.2): the token table
        where the model ties it, else the LM head's own decoder (never the input table alone)."""
        return self.lm.projection()[0]

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        """Spans selected and replaced; labels plus, per selected position, its span's
        boundary positions (span_left = s-1, span_right = e+1) and span_pos = i-s+1."""
        ids = list(example["input_ids"])
        candidates = [i for i, t in enumerate(ids) if t not in self.special]
        n = budget(len(candidates), self.rate, generator)
        spans = select_spans(words(example, candidates), n, len(ids), self.lengths, generator)
        labels, left, right, pos = [IGNORE] * len(ids), [0] * len(ids), [0] * len(ids), [0] * len(ids)
        for s, e in spans:
            u = float(torch.rand((), generator=generator))  # one 80/10/10 decision per span
            randoms = self.random_tokens(e - s + 1, generator)
            for i in range(s, e + 1):
                labels[i], left[i], right[i], pos[i] = ids[i], s - 1, e + 1, i - s + 1
                if u < self.replace[0]:
                    ids[i] = self.mask_id
                elif u < self.replace[0] + self.replace[1]:
                    ids[i] = randoms[i - s]
        out = {k: v for k, v in example.items() if k != "word_starts"}
        return {**out, "input_ids": ids, "labels": labels, "span_left": left, "span_right": right,
                "span_pos": pos}

    def sbo_loss(self, hidden: torch.Tensor, batch: dict) -> tuple:
        """Cross-entropy of the SBO's predictions at the selected positions, and its accuracy."""
        selected = batch["labels"] != IGNORE  # (B, T)
        rows = torch.arange(hidden.shape[0], device=hidden.device)[:, None].expand_as(selected)[selected]
        left = hidden[rows, batch["span_left"][selected]]  # (N, d)
        right = hidden[rows, batch["span_right"][selected]]
        logits = self.sbo(left, right, batch["span_pos"][selected], self.output_embedding())  # (N, V)
        target = batch["labels"][selected]
        loss = F.cross_entropy(logits.float(), target)
        return loss, top1_accuracy(logits, target)

    def forward(self, batch: dict) -> Loss:
        """MLM + SBO, each the mean over the selected positions (sec. 3.2: summed per token)."""
        hidden = self.model(batch["input_ids"], batch["attention_mask"],
                            segment_ids=batch.get("segment_ids"), run_heads=False).last_hidden_state
        if not (batch["labels"] != IGNORE).any():  # short sequences may draw no span at all
            zero = hidden.sum() * 0.0  # the same metric names on every step (ranks average them)
            names = ("mlm_accuracy", "mlm_loss", "sbo_loss", "sbo_accuracy")
            return Loss(zero, {k: zero.detach() for k in names})
        mlm = self.mlm_loss(hidden, batch["labels"])
        sbo, accuracy = self.sbo_loss(hidden, batch)
        return Loss(mlm.loss + sbo, {**mlm.metrics, "mlm_loss": mlm.loss.detach(),
                                     "sbo_loss": sbo.detach(), "sbo_accuracy": accuracy.detach()})


register(ObjectiveSpec(name="span", build=SpanMLM.build,
                       summary="span masking + span-boundary objective (SpanBERT)",
                       aliases=("spanbert",), architectures=("encoder",), tokenizer="bert",
                       examples=ExampleFormat("sentences", word_starts=True)))
