"""The extractive reader over the top-k retrieved passages (DPR, Karpukhin et al. 2020, sec. 6.1):
one encoder reads "[CLS] question [SEP] title. text [SEP]" for each passage; the library's span QA
head gives start / end logits per token and a passage-selection head gives one logit per passage
from [CLS] (w_selected). Training: cross-entropy of the positive passage among the question's
passages (the positive and BM25 / retrieved negatives), plus, as DPR's objective, the marginal
negative log-likelihood of ALL correct answer spans inside the positive's window (every
case-insensitive whole-word occurrence of every gold answer, at most MAX_SPANS of them):
-log sum_{(s, e)} P_start(s) P_end(e), each span's start and end log-probabilities added whole (DPR's
code: compute_loss sums the start and end cross-entropies per span, `_calc_mml` marginalises them; it
sums both terms over the batch's questions, we average both: the same objective at a learning-rate
scale); a positive whose answers all lie past its window trains the [CLS] position. Reading: the passage
with the highest selection score (plus `retrieval_weight` x the retriever's log-softmax score, when
given) and its best span: the highest start + end logit over every span of at most max_answer_len of
the passage's own tokens (DPR's get_best_spans; never the question, [CLS] or [SEP]).
"""
from __future__ import annotations

import os
import re

import torch
import torch.nn.functional as F

from lmforge.config.options import OptionsError
from lmforge.fast.optimize import optimize
from lmforge.io import load
from lmforge.io.resolve import find_model_dir
from lmforge.objectives.base import Loss, Objective, pad
from lmforge.retrieval.answers import whole_words
from lmforge.retrieval.dpr import pad_batch, passage_text
from lmforge.retrieval.heads import head_or_new, seeded_heads
from lmforge.tasks.qa import QuestionRules, Template, answer_tokens, exact_match, features, window_spans
from lmforge.tokenizer import load_tokenizer

READER_HEADS = ("span-qa", "select")  # the answer span and the passage selection
MAX_SPANS = 10  # answer spans of a positive the span loss marginalises over (DPR's max_n_answers)


def answer_spans(context: str, answers: list) -> list:
    """Distinct (start, end) characters of every case-insensitive whole-word occurrence (overlapping ones
    too) of each non-empty answer in `context`: the answers in order, each one's occurrences left to right."""
    # whole words, as DPR matches answers by tokens: "Rome" inside "Romeo" is no gold span
    found = [(m.start(1), m.end(1)) for answer in answers if answer
             for m in re.finditer(f"(?=({whole_words(answer)}))", context, re.IGNORECASE)]
    return list(dict.fromkeys(found))


def answer_start(context: str, answers: list) -> tuple:
    """(character start, answer text) of the first answer found in `context` (case-insensitive, whole
    words), or (None, None)."""
    found = answer_spans(context, answers)
    return (found[0][0], context[found[0][0]:found[0][1]]) if found else (None, None)


def token_spans(context: str, found: list, w: dict) -> list:
    """Distinct (start, end) positions in window `w` of the first MAX_SPANS character spans of `found` that
    lie whole inside it, by the QA task's character -> token mapping over the window's own offsets (those
    features() encoded: no second encoding); a span that reaches text past the window's last token (any
    but whitespace, which no token covers) is out, as the task's gold is."""
    offsets, spans = w["offsets"], []
    last = offsets[-1][1] if offsets else 0
    for start, end in found:
        first, final = answer_tokens(offsets, start, end)
        if first is None or context[max(start, last):end].strip():
            continue
        span = (first + w["context_at"], final + w["context_at"])
        if span not in spans:
            spans.append(span)
        if len(spans) == MAX_SPANS:
            break
    return spans


def window(tokenizer, template: Template, question: str, passage, answers=(), max_len: int = 128) -> dict:
    """One passage's reader input (its first window of max_len tokens); given answers, "answer_spans": the
    positions of the answers' spans inside it (token_spans), the first also its start/end positions,
    or the [CLS] position when none lies inside."""
    context = passage_text(passage)
    record = {"question": question, "context": context}
    found = answer_spans(context, list(answers))
    if answers:
        record["answers"] = [{"text": context[s:e], "start": s} for s, e in found[:1]]
    w = features(tokenizer, record, template, max_len, doc_stride=0, max_query_len=max_len // 2)[0]
    if answers:
        spans = token_spans(context, found, w)
        if spans:  # the first occurrence may lie past the window where a later one does not
            w["start_positions"], w["end_positions"] = spans[0]
        w["answer_spans"] = spans or [(w["start_positions"], w["end_positions"])]
    return w


class ExtractiveReader(Objective):
    """DPR's reader: passage selection + answer span, trained on (positive, negatives) groups; heads the
    model lacks start untrained, drawn from `seed` (the run's)."""

    name = "reader"

    def __init__(self, model, tokenizer, max_len: int = 128, seed: int = 0) -> None:
        super().__init__(model, pad_id=tokenizer.special_id("pad") or 0)
        if model.config.architecture != "encoder":
            raise OptionsError(f"a reader must be an encoder model, not {model.config.architecture}",
                               "model")  # the field: the command line names its --model
        with seeded_heads(seed):  # one stream for both: the selection head's draw follows the span head's
            self.span = head_or_new(model, "span-qa", "span-qa")
            self.select = head_or_new(model, "select", "classification", n_labels=1, pooler=False)
        self.tokenizer, self.template, self.max_len = tokenizer, Template.of(tokenizer), max_len
        self.rules = QuestionRules(model.config)  # the QA task's reading of the question, as the reference's

    @classmethod
    def from_dir(cls, name: str | os.PathLike, max_len: int = 128, trained: bool = False,
                 seed: int = 0) -> "ExtractiveReader":
        """A reader directory; with trained=False (to train one) any encoder, its heads started untrained
        (from `seed`); with trained=True (to read) only a trained reader: a plain encoder would answer
        with random heads."""
        path = find_model_dir(name)
        model = load(path)
        missing = [head for head in READER_HEADS if head not in model.heads]
        if trained and missing:
            raise ValueError(f"{path}: not a trained reader: it has no {' or '.join(missing)} head (heads: "
                             f"{', '.join(model.heads) or 'none'}); train one with `lmforge retrieve reader`")
        reader = cls(model, load_tokenizer(path), max_len, seed)
        optimize(reader.model)  # after the heads are made: they run optimized too
        return reader

    def heads(self) -> dict:
        """The span and selection heads, saved with the encoder."""
        return {"span-qa": self.span, "select": self.select}

    def group(self, question: str, answers: list, positive, negatives: list) -> dict:
        """A training example: the positive passage's window first, then the negatives'."""
        windows = [window(self.tokenizer, self.template, question, positive, answers, self.max_len)]
        windows += [window(self.tokenizer, self.template, question, p, (), self.max_len) for p in negatives]
        return {"windows": windows}

    def collate(self, examples: list) -> dict:
        """Groups of M windows (same M) -> (B * M, T) ids, segments, mask; (B, K, 2) answer spans of each
        positive (its window is row b * M), padded with -1 to the most any has."""
        rows = [w for e in examples for w in e["windows"]]
        ids, mask = pad_batch([w["input_ids"] for w in rows], self.pad_id)
        spans = [e["windows"][0]["answer_spans"] for e in examples]
        most = max(len(s) for s in spans)
        spans = [[*map(list, s)] + [[-1, -1]] * (most - len(s)) for s in spans]
        return {"input_ids": ids, "attention_mask": mask,
                "segment_ids": pad([w["segment_ids"] for w in rows], 0),
                "question_end": torch.tensor([w["question_end"] for w in rows]),
                "answer_spans": torch.tensor(spans), "group": torch.tensor(len(examples[0]["windows"]))}

    def scores(self, batch: dict) -> tuple:
        """((N, T, 2) span logits, (N,) selection logits) of N windows."""
        mask, question_end = batch["attention_mask"], batch["question_end"]
        hidden = self.model(batch["input_ids"], mask, segment_ids=batch["segment_ids"], run_heads=False,
                            **self.rules.inputs(mask, question_end)).last_hidden_state  # (N, T, d)
        span = self.rules.masked(self.span(hidden, mask).float(), question_end)
        return span, self.select(hidden).float().squeeze(-1)

    def forward(self, batch: dict) -> Loss:
        """Selection NLL of each positive among its group + the marginal NLL of its answer spans, each
        averaged over the questions (DPR's reader loss: module docstring)."""
        span, select = self.scores(batch)
        M = int(batch["group"])
        select = select.view(-1, M)  # (B, M): the positive at column 0
        target = torch.zeros(len(select), dtype=torch.long, device=select.device)
        positives = span[::M]  # (B, T, 2)
        selection = F.cross_entropy(select, target)
        accuracy = (select.argmax(-1) == target).float().mean()
        return Loss(selection + span_nll(positives, batch["answer_spans"]).mean(),
                    {"selection_accuracy": accuracy.detach()})

    @torch.no_grad()
    def read(self, question: str, passages: list, retrieval_scores=None, retrieval_weight: float = 0.0,
             max_answer_len: int = 10) -> dict:
        """{"answer", "id" (its passage), "score"}: the best-selected passage's best span."""
        self.eval()
        windows = [window(self.tokenizer, self.template, question, p, (), self.max_len) for p in passages]
        ids, mask = pad_batch([w["input_ids"] for w in windows], self.pad_id)
        device = next(self.model.parameters()).device
        batch = {"input_ids": ids.to(device), "attention_mask": mask.to(device),
                 "segment_ids": pad([w["segment_ids"] for w in windows], 0).to(device),
                 "question_end": torch.tensor([w["question_end"] for w in windows], device=device)}
        span, select = self.scores(batch)
        select = torch.log_softmax(select, -1)
        if retrieval_scores is not None and retrieval_weight:
            prior = torch.as_tensor(retrieval_scores, dtype=torch.float, device=select.device)
            select = select + retrieval_weight * torch.log_softmax(prior, -1)
        best = int(select.argmax())
        w = windows[best]
        n = len(w["offsets"])  # every start x every end, as DPR's get_best_spans: a top-20 x top-20 cut can
        # miss the best length-bounded span (or find none) when the top starts all lie past the top ends
        spans = window_spans(span[best, :, 0].tolist(), span[best, :, 1].tolist(), w["context_at"], n,
                             n_best=n, max_answer_len=max_answer_len)
        text = ""
        if spans:
            _, s, e = spans[0]
            text = passage_text(passages[best])[w["offsets"][s][0]:w["offsets"][e][1]]
        return {"answer": text, "id": passages[best].id, "score": float(select[best])}


def span_nll(logits: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    """(B,) -log sum over each row's spans of P_start(s) P_end(e), from (B, T, 2) logits and (B, K, 2)
    spans (-1: padding; each row has one real span at least)."""
    logp = torch.log_softmax(logits, dim=1)
    at = spans.to(logits.device).clamp(min=0)
    joint = logp[..., 0].gather(1, at[..., 0]) + logp[..., 1].gather(1, at[..., 1])  # (B, K)
    return -torch.logsumexp(joint.masked_fill(spans.to(logits.device)[..., 0] < 0, float("-inf")), dim=1)


def reader_examples(reader: ExtractiveReader, records: list, passages: list, rankings: list,
                    n_negatives: int = 3) -> list:
    """Training groups: each record's first positive that holds an answer, and the first
    `n_negatives` ranked passages that are not positives and hold no answer (as whole words: one holding
    only "Romeo" is a negative for "Rome")."""
    by_id = {p.id: p for p in passages}
    out = []
    for r, ranked in zip(records, rankings):
        positive = next((by_id[i] for i in r["positives"]
                         if answer_start(passage_text(by_id[i]), r["answers"])[0] is not None), None)
        negatives = [by_id[i] for i in ranked if i not in r["positives"]
                     and answer_start(passage_text(by_id[i]), r["answers"])[0] is None][:n_negatives]
        if positive is not None and len(negatives) == n_negatives:
            out.append(reader.group(r["question"], r["answers"], positive, negatives))
    return out


def reader_exact_match(reader: ExtractiveReader, records: list, passages: list, rankings: list, k: int = 5,
                       retrieval_scores: list | None = None, retrieval_weight: float = 0.0) -> float:
    """Share of records whose answer, read from their top-k ranked passages, matches a gold answer."""
    by_id, hits = {p.id: p for p in passages}, 0.0
    for n, (r, ranked) in enumerate(zip(records, rankings)):
        scores = retrieval_scores[n][:k] if retrieval_scores is not None else None
        answer = reader.read(r["question"], [by_id[i] for i in ranked[:k]], scores,
                             retrieval_weight)["answer"]
        hits += max(exact_match(gold, answer) for gold in r["answers"])
    return hits / max(1, len(records))
