"""Rerankers: a cross-encoder scores a (query, document) pair with one output (Nogueira & Cho 2019,
"Passage Re-ranking with BERT": [CLS] query [SEP] document [SEP] -> the pooled [CLS] -> one logit).

A record is a query, its positive document and its negatives (hardest first, as a retriever ranks
them), and for distillation a teacher's score of each document:

    {"query": "...", "positive": "...", "negatives": ["...", ...], "scores": [9.1, 2.3, ...]}

or, for predictions only, {"query": "...", "documents": ["...", ...]}. In the canonical record the
positive is documents[0] and "label" is 0 (its index), so the task's gold is a label like any other.

Losses (RerankOptions.loss), over the positive and the first `negatives` negatives of each record:
- bce: binary cross-entropy of each pair, 1 for the positive and 0 for a negative (monoBERT's);
- listwise: softmax cross-entropy of the positive among its record's documents, at a temperature
  (InfoNCE; the "localised contrastive estimation" of Gao et al. 2021);
- distill: the teacher's scores, by mean squared error (Hofstätter et al. 2020's Margin-MSE family)
  or by KL divergence of the softmax distributions at the temperature (listwise distillation).
Validation ranks every document of a record: MRR@10 (primary) and recall@1.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from lmforge.config.options import OptionsError, check_options, option
from lmforge.objectives.base import Loss
from lmforge.tasks.base import Task, register
from lmforge.tasks.classify import SequenceTask, checked_activation
from lmforge.tasks.formats import Records, read_rows

MAX_DOCUMENTS = 1000  # documents of one record: its validation ranking runs them in one batch
MASKED = -1e4  # a padding document's score: finite, so KL's 0 x log 0 stays 0 (-inf would give NaN)


@dataclass
class RerankOptions:
    """How a reranker trains: the loss, negatives per query, the distillation target, the temperature."""

    loss: str = option("listwise", "rerank: bce (each pair), listwise (softmax over the query's documents) "
                       "or distill (the records' teacher scores)", choices=("bce", "listwise", "distill"))
    negatives: int = option(7, "rerank: negatives per query in training (the first ones of each record)",
                            low=1, high=MAX_DOCUMENTS - 1)
    distill: str = option("mse", "rerank: distill by mse of the scores or kl of their softmax",
                          choices=("mse", "kl"))
    temperature: float = option(1.0, "rerank: softmax temperature of listwise and kl", low=0.01, high=100)

    def __post_init__(self) -> None:
        check_options(self)


def rerank_option(name: str):
    """A RerankOptions field declared again (same default, help and bounds) for the fine-tuning options."""
    (found,) = [f for f in fields(RerankOptions) if f.name == name]
    meta = found.metadata
    return option(found.default, meta["help"], low=meta["low"], high=meta["high"], choices=meta["choices"])


def _text(where: str, field: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise OptionsError(f"{where}: {field} must be non-empty text, got {json.dumps(value)[:40]}")
    return value


def _texts(where: str, field: str, value, least: int) -> list:
    if not isinstance(value, list) or len(value) < least:
        raise OptionsError(f"{where}: {field} must be a list of at least {least} text(s), "
                           f"got {json.dumps(value)[:40]}")
    if len(value) > MAX_DOCUMENTS - 1:
        raise OptionsError(f"{where}: {len(value)} {field}, more than {MAX_DOCUMENTS - 1}")
    return [_text(f"{where}: {field}[{i}]", "it", v) for i, v in enumerate(value)]


def _teacher(where: str, value, n: int) -> list:
    if not isinstance(value, list) or len(value) != n or not all(
            isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in value):
        raise OptionsError(f"{where}: scores must be {n} finite numbers (the positive's, then each "
                           f"negative's), got {json.dumps(value)[:40]}")
    return [float(s) for s in value]


def rerank_record(where: str, row: dict, labelled: bool = True) -> dict:
    """One canonical record of a row (see the module docstring); an error naming `where` and the field."""
    if "documents" in row and "positive" not in row:
        if labelled:
            raise OptionsError(f"{where}: no field 'positive' (a rerank record has query, positive, "
                               "negatives)")
        return {"query": _text(where, "query", row.get("query")),
                "documents": _texts(where, "documents", row["documents"], 1), "label": None, "scores": None}
    missing = [k for k in ("query", "positive", "negatives") if k not in row]
    if missing:
        raise OptionsError(f"{where}: no field(s) {missing} (a rerank record has query, positive, "
                           f"negatives; it has {', '.join(map(repr, row))})")
    documents = [_text(where, "positive", row["positive"]), *_texts(where, "negatives", row["negatives"], 1)]
    scores = _teacher(where, row["scores"], len(documents)) if row.get("scores") is not None else None
    return {"query": _text(where, "query", row["query"]), "documents": documents, "label": 0,
            "scores": scores}


def read_rerank(path, labelled: bool = True) -> Records:
    """The rerank records of a JSONL file, each with "line"."""
    return Records([{**rerank_record(f"{path}:{n}", row, labelled), "line": n}
                    for n, row in read_rows(path)], path)


@register
class RerankTask(SequenceTask):
    """A cross-encoder: one output per (query, document) pair, trained on records of documents."""

    kind = "rerank"
    n_outputs = 1
    options = ("loss", "negatives", "distill", "temperature", "activation")

    def __init__(self, model, tokenizer, labels: list | None = None, max_len: int = 128,
                 loss: str = "listwise", negatives: int = 7, distill: str = "mse", temperature: float = 1.0,
                 activation: str | None = None) -> None:
        settings = RerankOptions(loss, negatives, distill, temperature)  # checked, naming the field
        # how a score is read from the logit (pipelines/rerank.py Reranker): a CrossEncoder's, else sigmoid
        self.activation = checked_activation(activation, "sigmoid")
        super().__init__(model, tokenizer, None, max_len)
        self.loss, self.negatives, self.distill, self.temperature = (
            settings.loss, settings.negatives, settings.distill, settings.temperature)

    @classmethod
    def labels_from(cls, records: list) -> None:
        """A reranker has no label set."""
        return None

    def encode(self, record: dict) -> list:
        """One example: every (query, document) pair, the positive's index and the teacher's scores (a record
        of query, positive and negatives, as a file holds it, is read as read_rerank reads it)."""
        if "documents" not in record:
            record = rerank_record(f"record {record.get('line', '?')}", record)
        example = {"pairs": [self.encode_text(record["query"], d) for d in record["documents"]]}
        if record.get("scores") is not None:
            example["teacher"] = list(record["scores"])
        return [example]

    def check_trainable(self, records: list, split: str = "training") -> None:
        """loss=distill trains on the teacher's scores: a training record without them is refused naming its
        line, before any step (validation ranks by the model's own scores and needs none)."""
        if self.loss != "distill" or split != "training":
            return
        for record in records:
            if record.get("scores") is None:
                raise ValueError(f"line {record.get('line', '?')}: loss=distill needs every training "
                                 'record\'s teacher "scores" (one per document: the positive\'s, then each '
                                 "negative's)")

    def length(self, example: dict) -> int:
        """Tokens of the longest pair."""
        return max(len(p["input_ids"]) for p in example["pairs"])

    def collate(self, examples: list) -> dict:
        """(B x C, T) pairs, the (B, C) document mask and teacher scores; in training each record keeps
        its positive and first `negatives` negatives, in evaluation all its documents."""
        keep = 1 + self.negatives if self.training else MAX_DOCUMENTS
        docs = [e["pairs"][:keep] for e in examples]
        C = max(map(len, docs))
        batch = Task.collate(self, [d[min(c, len(d) - 1)] for d in docs for c in range(C)])
        batch["doc_mask"] = torch.tensor([[c < len(d) for c in range(C)] for d in docs])
        if all("teacher" in e for e in examples):
            batch["teacher"] = torch.tensor([(e["teacher"][:keep] + [0.0] * C)[:C] for e in examples])
        return batch

    def doc_scores(self, batch: dict) -> torch.Tensor:
        """(B, C) scores, MASKED at padding documents."""
        mask = batch["doc_mask"]
        return self.scores(batch).view(mask.shape).masked_fill(~mask, MASKED)

    def forward(self, batch: dict) -> Loss:
        """The chosen loss (see the module docstring) and the share of queries whose positive is first."""
        s, mask = self.doc_scores(batch), batch["doc_mask"]
        first = torch.zeros(len(s), dtype=torch.long, device=s.device)
        if self.loss == "bce":
            target = torch.zeros_like(s)
            target[:, 0] = 1.0
            loss = F.binary_cross_entropy_with_logits(s[mask], target[mask])
        elif self.loss == "listwise":
            loss = F.cross_entropy(s / self.temperature, first)
        elif "teacher" not in batch:
            raise ValueError('loss=distill needs every training record\'s teacher "scores"')
        elif self.distill == "mse":
            loss = F.mse_loss(s[mask], batch["teacher"][mask])
        else:
            teacher = batch["teacher"].masked_fill(~mask, MASKED)
            loss = F.kl_div(F.log_softmax(s / self.temperature, -1),
                            F.softmax(teacher / self.temperature, -1), reduction="batchmean")
        return Loss(loss, {"accuracy": (s.argmax(-1) == first).float().mean().detach()})

    def predict(self, batch: dict) -> list:
        """Each record's scores of its own documents."""
        rows = self.doc_scores(batch).tolist()
        return [row[: int(n)] for row, n in zip(rows, batch["doc_mask"].sum(-1))]

    def decode(self, records: list, examples: list, outputs: list) -> list:
        """Each record's document indices, best first (see ranking: ties never favour the positive)."""
        return [ranking(s) for s in outputs]

    def score(self, records: list, predictions: list) -> dict:
        """mrr@10 (primary) and recall@1 of the gold document (documents[label]) in each ranking."""
        return ranking_metrics([r["label"] for r in records], predictions)

    def pair_scores(self, query: str, documents: list, batch_size: int = 64) -> list:
        """The raw score of each (query, document) pair, in the documents' order."""
        examples = [{"pairs": [self.encode_text(query, d)]} for d in documents]
        return [s[0] for s in self.outputs(examples, batch_size)]


def ranking(scores: list) -> list:
    """Document indices, best first: tied scores put the later document first, NaN scores go last."""
    # The positive is documents[0]: ties broken toward earlier documents credited a model for ties it
    # never resolved (a collapsed, constant-score reranker scored mrr@10 1.0). Like trec_eval, which
    # breaks ties by descending document id, a tie here costs the positive its place.
    key = [-math.inf if math.isnan(s) else s for s in scores]
    return sorted(range(len(scores)), key=lambda i: (key[i], i), reverse=True)


def ranking_metrics(gold: list, rankings: list, k: int = 10) -> dict:
    """{"mrr@10": mean of 1 / rank of the gold index within the first k (0 beyond), "recall@1"}."""
    if len(gold) != len(rankings):  # zip would score the shorter side alone
        raise OptionsError(f"{len(gold)} gold documents but {len(rankings)} rankings", "rankings")
    if not gold:
        raise OptionsError("no records to score", "gold")
    ranks = [ranking.index(g) + 1 for g, ranking in zip(gold, rankings)]
    return {f"mrr@{k}": sum(1 / r for r in ranks if r <= k) / len(ranks),
            "recall@1": sum(r == 1 for r in ranks) / len(ranks)}
