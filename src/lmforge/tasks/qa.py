"""Extractive question answering (Devlin et al. 2019, sec. 4.2-4.3; SQuAD, Rajpurkar et al.
2016, 2018): start/end logits over the context, long contexts in overlapping windows.

Features. A record becomes one example per window of its context:
`[CLS] question [SEP] context[window] [SEP]` (the tokenizer's own pair template), at most
`max_len` tokens, the question cut to `max_query_len` tokens; consecutive windows overlap
by `doc_stride` tokens (the reference library's `stride`), so every answer shorter than
the overlap lies whole in some window. Each window keeps its context tokens' character
offsets. Its gold start/end are the answer's first and last tokens when the answer lies
whole inside the window, else the [CLS] index (0 when the tokenizer has no [CLS]) — also
for an unanswerable question (SQuAD 2.0).

The reference's QA models of two attentions read the question specially, and so does the task
(keyed on the attention pattern; the model's forward stays plain): with a Longformer layer the
tokens before the first separator ([CLS] and the question) attend globally, as the reference's
LongformerForQuestionAnswering makes them without a global_attention_mask; with a BigBird layer
the question and the separator after it lose 1e6 from their logits, as BigBirdForQuestionAnswering
takes it off (its `question_lengths`), so a loss does not spread over them ([CLS] keeps its logits).

Decoding. In every window the `n_best` highest start and end logits inside the context
are paired (end >= start, at most `max_answer_len` tokens); the best pair over all of a
record's windows by start + end logit gives the answer's characters. With SQuAD 2.0
(`unanswerable=True`; by default on once an unanswerable record is encoded) the null
score is the smallest [CLS] start + end over the windows, and the answer is "" when it
beats the best span's score by more than `null_threshold`.

Reading SQuAD files and the official exact match / F1 live in tasks/squad.py (imported here too).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lmforge.config.checks import pattern_set
from lmforge.objectives.base import Loss
from lmforge.tasks.base import Task, notes, register
# SQuAD reading and scores moved to tasks/squad.py; callers (retrieval, serve, formats) still import them here
from lmforge.tasks.squad import (exact_match, gold_texts, normalize_answer, read_squad,  # noqa: F401
                                 squad_scores, token_f1)  # noqa: F401

# ---- windows -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """A tokenizer's pair template split around the two texts: special ids before the question,
    between question and context, after the context; the segment ids of each part."""

    before: tuple
    between: tuple
    after: tuple
    segments: tuple  # segment ids of (before, question, between, context, after)

    @classmethod
    def of(cls, tokenizer) -> "Template":
        """Read the template off the encoding of a pair (its special tokens have no sequence id)."""
        enc = tokenizer.encode("a", "b")
        seq = enc.sequence_ids
        q = [i for i, s in enumerate(seq) if s == 0]
        c = [i for i, s in enumerate(seq) if s == 1]
        if not q or not c:
            raise ValueError("the tokenizer drops a text of a pair; it cannot encode question + context")
        parts = (range(0, q[0]), range(q[-1] + 1, c[0]), range(c[-1] + 1, len(seq)))
        before, between, after = (tuple(enc.ids[k] for k in r) for r in parts)
        segments = tuple(enc.segment_ids[r[0]] if len(r) else 0 for r in (parts[0], q, parts[1], c, parts[2]))
        return cls(before, between, after, segments)

    @property
    def n_special(self) -> int:
        """Special tokens the template adds."""
        return len(self.before) + len(self.between) + len(self.after)


def window_starts(n: int, room: int, doc_stride: int) -> list:
    """First context token of each window of `room` tokens over `n`, overlapping by `doc_stride`."""
    if doc_stride >= room:
        raise ValueError(f"doc_stride={doc_stride} must be smaller than the {room} context tokens a "
                         f"window holds (raise max_len or lower doc_stride / max_query_len)")
    starts = [0]
    while starts[-1] + room < n:
        starts.append(starts[-1] + room - doc_stride)
    return starts


def answer_tokens(offsets: list, start: int, end: int) -> tuple:
    """First and last context tokens covering characters [start, end) (None if none overlap)."""
    covering = [k for k, (s, e) in enumerate(offsets) if s < end and e > start]
    return (covering[0], covering[-1]) if covering else (None, None)


def features(tokenizer, record: dict, template: Template, max_len: int = 384, doc_stride: int = 128,
             max_query_len: int = 64, question: list | None = None) -> list:
    """A record's windows: input/segment ids, "question_end" (the index of the separator after the
    question), start/end positions (if it has answers), and for decoding "context_at" (first context
    token index) and "offsets" of its context tokens. `question`: the question's token ids where the
    caller has them (QATask, which counts a cut one), else they are encoded here."""
    if question is None:
        question = tokenizer.encode(record["question"], add_special_tokens=False).ids
    question = question[:max_query_len]
    context = tokenizer.encode(record["context"], add_special_tokens=False)
    room = max_len - len(question) - template.n_special
    if room < 1:
        raise ValueError(f"max_len={max_len} leaves no room for the context next to a question of "
                         f"{len(question)} tokens")
    gold = None
    if "answers" in record:
        answer = record["answers"][0] if record["answers"] else None  # training uses the first answer
        gold = (None, None) if answer is None else answer_tokens(
            context.offsets, answer["start"], answer["start"] + len(answer["text"]))
    head = [*template.before, *question, *template.between]
    cls = head.index(tokenizer.cls_id) if tokenizer.cls_id in head else 0
    s_before, s_q, s_between, s_ctx, s_after = template.segments
    out = []
    for first in window_starts(len(context.ids), room, doc_stride):
        ids = context.ids[first:first + room]
        example = {"input_ids": head + ids + list(template.after),
                   "segment_ids": ([s_before] * len(template.before) + [s_q] * len(question)
                                   + [s_between] * len(template.between) + [s_ctx] * len(ids)
                                   + [s_after] * len(template.after)),
                   "question_end": len(template.before) + len(question),
                   "context_at": len(head), "offsets": context.offsets[first:first + len(ids)],
                   "cls_index": cls}
        if gold is not None:
            inside = gold[0] is not None and first <= gold[0] and gold[1] < first + len(ids)
            example["start_positions"] = gold[0] - first + len(head) if inside else cls
            example["end_positions"] = gold[1] - first + len(head) if inside else cls
        out.append(example)
    return out


class QuestionRules:
    """The reference QA models' reading of the question (module docstring), for a model's config."""

    def __init__(self, config) -> None:
        patterns = pattern_set(config)
        self.global_question, self.mask_question = "longformer" in patterns, "bigbird" in patterns

    def inputs(self, mask: torch.Tensor, question_end: torch.Tensor) -> dict:
        """The forward's extra inputs for a (B, T) mask and (B,) question ends: global_tokens on a
        Longformer, nothing else (other models take none: XLNet's forward has no such input)."""
        before = torch.arange(mask.shape[1], device=mask.device) < question_end[:, None].to(mask.device)
        return {"global_tokens": before & mask.bool()} if self.global_question else {}

    def masked(self, logits: torch.Tensor, question_end: torch.Tensor) -> torch.Tensor:
        """(B, T, 2) float logits with a BigBird's positions 1 ..= question_end lowered by 1e6 (position 0,
        [CLS], is the null answer); as given on other models."""
        if not self.mask_question:
            return logits
        positions = torch.arange(logits.shape[1], device=logits.device)
        hide = (positions > 0) & (positions <= question_end[:, None].to(logits.device))
        return logits - hide[..., None].to(logits.dtype) * 1e6


# ---- decoding ----------------------------------------------------------------------------------


def window_spans(start_logits: list, end_logits: list, context_at: int, n_context: int, n_best: int = 20,
                 max_answer_len: int = 30) -> list:
    """Candidate spans of one window, best first: (score, first, last) context-token indices
    (relative to the window's context) among the n_best start x n_best end logits."""
    start = start_logits[context_at:context_at + n_context]
    end = end_logits[context_at:context_at + n_context]
    top = sorted(range(len(start)), key=lambda k: -start[k])[:n_best]
    ends = set(sorted(range(len(end)), key=lambda k: -end[k])[:n_best])
    # each start's few admissible ends (max_answer_len), not every pair of the two lists: with n_best the
    # window's length (the reader's every start x end) that is n x max_answer_len, not n^2; ties are
    # ordered as before (a start's equal-scored ends by position)
    spans = [(start[s] + end[e], s, e) for s in top for e in range(s, min(s + max_answer_len, len(end)))
             if e in ends]
    return sorted(spans, key=lambda x: -x[0])


def best_answer(windows: list, outputs: list, context: str, n_best: int = 20, max_answer_len: int = 30,
                unanswerable: bool = False, null_threshold: float = 0.0) -> tuple:
    """The answer text of one record from its windows' (start, end) logits, and its score:
    the best span over all windows, or "" when the null score beats it by > null_threshold."""
    best, null = None, None
    for window, (start_logits, end_logits) in zip(windows, outputs):
        cls = window["cls_index"]
        score = start_logits[cls] + end_logits[cls]
        null = score if null is None else min(null, score)
        spans = window_spans(start_logits, end_logits, window["context_at"], len(window["offsets"]),
                             n_best, max_answer_len)
        if spans and (best is None or spans[0][0] > best[0]):
            s, e = spans[0][1:]
            best = (spans[0][0], window["offsets"][s][0], window["offsets"][e][1])
    if best is None or (unanswerable and null - best[0] > null_threshold):
        return "", null
    return context[best[1]:best[2]], best[0]


# ---- the task ----------------------------------------------------------------------------------


@register
class QATask(Task):
    """Extractive QA: start and end logits over [CLS] question [SEP] context-window [SEP].

    doc_stride (overlap of windows) defaults to max_len // 3 and max_query_len to
    min(64, max_len // 2); unanswerable=None turns null answers on once an unanswerable
    record is encoded (SQuAD 2.0 data), True / False force it."""

    kind = "qa"
    head = "span-qa"
    meta_keys = ("context_at", "offsets", "cls_index")
    options = ("doc_stride", "max_query_len", "n_best", "max_answer_len", "unanswerable", "null_threshold")
    question_cut = 0  # records of the last encode_all whose question was cut to max_query_len (say_cut)

    def __init__(self, model, tokenizer, labels: list | None = None, max_len: int = 384,
                 doc_stride: int | None = None, max_query_len: int | None = None, n_best: int = 20,
                 max_answer_len: int = 30, unanswerable: bool | None = None,
                 null_threshold: float = 0.0) -> None:
        super().__init__(model, tokenizer, None, max_len)
        # defaults scale with max_len: BERT's SQuAD setting (384, stride 128, query 64) at 384
        self.doc_stride = self.max_len // 3 if doc_stride is None else doc_stride
        self.max_query_len = min(64, self.max_len // 2) if max_query_len is None else max_query_len
        self.n_best, self.max_answer_len = n_best, max_answer_len
        self.unanswerable, self.null_threshold = unanswerable, null_threshold
        self.template = Template.of(tokenizer)
        self.rules = QuestionRules(model.config)

    def head_args(self) -> dict:
        """The options of the model's own span-qa head (BigBird's ffn), so that its trained head is kept,
        not replaced by a fresh one of another spec."""
        own = self.model.heads["span-qa"] if "span-qa" in self.model.heads else None
        return {k: v for k, v in own.spec.items() if k != "kind"} if own is not None else {}

    def encode_all(self, records: list) -> list:
        """The base's examples; `question_cut` counts the records whose question was cut to max_query_len
        tokens."""
        self.question_cut = 0
        return super().encode_all(records)

    def say_cut(self, n: int, what: str, log=None) -> None:
        """The base's line on cut records, and one on cut questions: the model reads only a question's
        first max_query_len tokens, which may not hold what it asks."""
        super().say_cut(n, what, log)
        if self.question_cut:
            notes(log)(
                f"{self.question_cut} of {n} {what} records have a question longer than max_query_len="
                f"{self.max_query_len} tokens, cut to its first {self.max_query_len}; raise max_query_len "
                f"to read more")

    def encode(self, record: dict) -> list:
        """One question -> one example per window of its context; answers must match the context."""
        for answer in record.get("answers", ()):
            text, start = answer["text"], answer["start"]
            if not text.strip():  # "" is found at any start and covers no token: it would train as null
                raise ValueError(f"line {record.get('line')}: the answer text is empty (an unanswerable "
                                 f"question has answers [])")
            if start < 0 or record["context"][start:start + len(text)] != text:  # -7: from the end
                raise ValueError(f"line {record.get('line')}: answer {text!r} is not at character {start} "
                                 f"of the context")
        if self.unanswerable is None and record.get("answers") == []:
            self.unanswerable = True  # SQuAD 2.0 data: a null answer can be right
        question = self.tokenizer.encode(record["question"], add_special_tokens=False).ids
        self.question_cut += len(question) > self.max_query_len
        return features(self.tokenizer, record, self.template, self.max_len, self.doc_stride,
                        self.max_query_len, question)

    def read_tokens(self, question: int, context: int) -> int:
        """The tokens a record's windows hold, for a question and a context of (at most) these many tokens:
        what the model reads, each overlap again (a server's bound on a record's cost)."""
        question = min(question, self.max_query_len)
        room = self.max_len - question - self.template.n_special
        if room < 1 or self.doc_stride >= room:  # encode refuses such a record: its tokens as given
            return question + context
        starts = window_starts(context, room, self.doc_stride)
        overhead = question + self.template.n_special  # each window holds the question again
        return len(starts) * overhead + sum(min(room, context - s) for s in starts)

    def logits(self, batch: dict) -> torch.Tensor:
        """(B, T, 2) float start and end logits of a padded batch (padding masked), by QuestionRules."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        hidden = self.model(ids, mask, segment_ids=batch.get("segment_ids"), run_heads=False,
                            **self.rules.inputs(mask, batch["question_end"])).last_hidden_state
        logits = self.task_head(hidden, mask).float()  # in float: 1e6 off a float16 logit is -inf
        return self.rules.masked(logits, batch["question_end"])

    def forward(self, batch: dict) -> Loss:
        """Mean of the start and end cross-entropies (BERT sec. 4.2)."""
        logits = self.logits(batch)
        start = F.cross_entropy(logits[..., 0], batch["start_positions"])
        end = F.cross_entropy(logits[..., 1], batch["end_positions"])
        return Loss((start + end) / 2, {"start_loss": start.detach(), "end_loss": end.detach()})

    def predict(self, batch: dict) -> list:
        """(start logits, end logits) over each example's real positions."""
        logits = self.logits(batch)
        lengths = batch["attention_mask"].sum(1).tolist()
        return [(row[:n, 0].tolist(), row[:n, 1].tolist()) for row, n in zip(logits, lengths)]

    def decode(self, records: list, examples: list, outputs: list) -> list:
        """One answer text per record ("" = unanswerable), the best over its windows."""
        windows: list = [[] for _ in records]
        for example, output in zip(examples, outputs):
            windows[example["record"]].append((example, output))
        return [best_answer([w for w, _ in pairs], [o for _, o in pairs], record["context"], self.n_best,
                            self.max_answer_len, bool(self.unanswerable), self.null_threshold)[0]
                for record, pairs in zip(records, windows)]

    def score(self, records: list, predictions: list) -> dict:
        """SQuAD F1 (primary) and exact match."""
        return squad_scores(records, predictions)
