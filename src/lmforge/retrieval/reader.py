"""The extractive reader over the top-k retrieved passages (DPR, Karpukhin et al. 2020, sec. 6.1):
one encoder reads "[CLS] question [SEP] title. text [SEP]" for each passage; the library's span QA
head gives start / end logits per token and a passage-selection head gives one logit per passage
from [CLS] (w_selected). Training: cross-entropy of the positive passage among the question's
passages (the positive and BM25 / retrieved negatives), plus the start and end cross-entropies of
the answer span inside the positive. Reading: the passage with the highest selection score (plus
`retrieval_weight` x the retriever's log-softmax score, when given) and its best span.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from lmforge.fast.optimize import optimize
from lmforge.io import load
from lmforge.io.resolve import find_model_dir
from lmforge.objectives.base import Loss, Objective, pad
from lmforge.retrieval.dpr import pad_batch, passage_text
from lmforge.retrieval.heads import head_or_new, seeded_heads
from lmforge.tasks.qa import QuestionRules, Template, exact_match, features, window_spans
from lmforge.tokenizer import load_tokenizer

READER_HEADS = ("span-qa", "select")  # the answer span and the passage selection


def answer_start(context: str, answers: list) -> tuple:
    """(character start, answer text) of the first answer found in `context` (case-insensitive),
    or (None, None)."""
    lowered = context.lower()
    for answer in answers:
        at = lowered.find(answer.lower()) if answer else -1
        if at >= 0:
            return at, context[at:at + len(answer)]
    return None, None


def window(tokenizer, template: Template, question: str, passage, answers=(), max_len: int = 128) -> dict:
    """One passage's reader input (its first window of max_len tokens), with start/end positions of
    an answer it holds (the [CLS] position when it holds none)."""
    context = passage_text(passage)
    record = {"question": question, "context": context}
    start, text = answer_start(context, list(answers))
    if answers:
        record["answers"] = [{"text": text, "start": start}] if start is not None else []
    return features(tokenizer, record, template, max_len, doc_stride=0, max_query_len=max_len // 2)[0]


class ExtractiveReader(Objective):
    """DPR's reader: passage selection + answer span, trained on (positive, negatives) groups; heads the
    model lacks start untrained, drawn from `seed` (the run's)."""

    name = "reader"

    def __init__(self, model, tokenizer, max_len: int = 128, seed: int = 0) -> None:
        super().__init__(model, pad_id=tokenizer.special_id("pad") or 0)
        if model.config.architecture != "encoder":
            raise ValueError(f"a reader must be an encoder model, not {model.config.architecture}")
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
        """Groups of M windows (same M) -> (B * M, T) ids, segments, mask; (B,) start / end of each
        positive (its window is row b * M)."""
        rows = [w for e in examples for w in e["windows"]]
        ids, mask = pad_batch([w["input_ids"] for w in rows], self.pad_id)
        return {"input_ids": ids, "attention_mask": mask, "segment_ids": pad([w["segment_ids"] for w in rows], 0),
                "question_end": torch.tensor([w["question_end"] for w in rows]),
                "start_positions": torch.tensor([e["windows"][0]["start_positions"] for e in examples]),
                "end_positions": torch.tensor([e["windows"][0]["end_positions"] for e in examples]),
                "group": torch.tensor(len(examples[0]["windows"]))}

    def scores(self, batch: dict) -> tuple:
        """((N, T, 2) span logits, (N,) selection logits) of N windows."""
        mask, question_end = batch["attention_mask"], batch["question_end"]
        hidden = self.model(batch["input_ids"], mask, segment_ids=batch["segment_ids"], run_heads=False,
                            **self.rules.inputs(mask, question_end)).last_hidden_state  # (N, T, d)
        span = self.rules.masked(self.span(hidden, mask).float(), question_end)
        return span, self.select(hidden).float().squeeze(-1)

    def forward(self, batch: dict) -> Loss:
        """Selection NLL of each positive among its group + its start and end NLL (DPR's reader loss)."""
        span, select = self.scores(batch)
        M = int(batch["group"])
        select = select.view(-1, M)  # (B, M): the positive at column 0
        target = torch.zeros(len(select), dtype=torch.long, device=select.device)
        positives = span[::M]  # (B, T, 2)
        start = F.cross_entropy(positives[..., 0], batch["start_positions"])
        end = F.cross_entropy(positives[..., 1], batch["end_positions"])
        selection = F.cross_entropy(select, target)
        accuracy = (select.argmax(-1) == target).float().mean()
        return Loss(selection + (start + end) / 2, {"selection_accuracy": accuracy.detach()})

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
        spans = window_spans(span[best, :, 0].tolist(), span[best, :, 1].tolist(), w["context_at"],
                             len(w["offsets"]), max_answer_len=max_answer_len)
        text = ""
        if spans:
            _, s, e = spans[0]
            text = passage_text(passages[best])[w["offsets"][s][0]:w["offsets"][e][1]]
        return {"answer": text, "id": passages[best].id, "score": float(select[best])}


def reader_examples(reader: ExtractiveReader, records: list, passages: list, rankings: list,
                    n_negatives: int = 3) -> list:
    """Training groups: each record's first positive that holds an answer, and the first
    `n_negatives` ranked passages that are not positives and hold no answer."""
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
        answer = reader.read(r["question"], [by_id[i] for i in ranked[:k]], scores, retrieval_weight)["answer"]
        hits += max(exact_match(gold, answer) for gold in r["answers"])
    return hits / max(1, len(records))
