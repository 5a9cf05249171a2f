"""Reranking with a fine-tuned cross-encoder (tasks/rerank.py): a query and documents -> each document's
relevance, best first; `lmforge.rerank`, the server's /rerank and `lmforge retrieve --rerank` share it.

    lmforge.rerank("runs/rerank/final", "which word means a traveller?", ["Wayfarer. One who ...", ...])
    -> [(0, 0.97), (2, 0.41), (1, 0.03)]

A document's score is the cross-encoder's logit through its task's activation (task.json's "activation",
TaskConfig.activation): sigmoid by default (a relevance in (0, 1), as sentence-transformers' CrossEncoder
gives for one output), a CrossEncoder's activation_fn (Identity: the logit itself); the order is the
logits' (ties: the earlier document first). A (query, document) pair longer than the model's max_len
tokens is cut (its tokens taken longest side first) and said so, or refused with truncate=false.
RerankQueryOptions holds a request's settings for the three faces.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from lmforge.config.options import (OptionsError, check_options, checked_argument, checked_text,
                                    checked_texts, named_keywords, option, with_changes)
from lmforge.pipelines.embed import MAX_BATCH_SIZE
from lmforge.tasks.classify import checked_activation
from lmforge.utils.errors import shown

MAX_TOP_N = 10 ** 6


@dataclass
class RerankQueryOptions:
    """One rerank request's settings (the server's documents are bounded by its max_documents)."""

    top_n: Optional[int] = option(None, "keep the best n documents; null: all of them", low=1, high=MAX_TOP_N)
    return_documents: bool = option(False, "put each document's text in its result")
    truncate: bool = option(True, "cut a (query, document) pair longer than the model's max_len; false: "
                            "refuse it")

    def __post_init__(self) -> None:
        check_options(self)

    @classmethod
    def build(cls, options: Optional["RerankQueryOptions"] = None, fields: Optional[dict] = None,
              from_text: bool = False) -> "RerankQueryOptions":
        """`options` (or the defaults) with the fields that are not None changed; a bad one names the
        field."""
        return with_changes(cls, options, fields, "rerank", from_text, drop_none=True)


@dataclass
class Ranked:
    """One document's place: its index in the request, relevance, logit, tokens read, whether it was cut."""

    index: int
    score: float
    logit: float
    tokens: int
    truncated: bool


def relevance(logit: float) -> float:
    """sigmoid(logit), in float64."""
    return 1 / (1 + math.exp(-logit)) if logit >= 0 else math.exp(logit) / (1 + math.exp(logit))


def order(logits: list) -> list:
    """Document indices by logit, best first; ties keep the documents' order (a retriever's), NaN logits go
    last, as the evaluation's ranking puts them (tasks/rerank.ranking, which breaks ties the other way
    on purpose: its positive comes first)."""
    return sorted(range(len(logits)), key=lambda i: (math.inf if math.isnan(logits[i]) else -logits[i], i))


class Reranker:
    """A fine-tuned RerankTask (its model, tokenizer and max_len) as a scorer of documents."""

    def __init__(self, task, activation: str | None = None) -> None:
        if getattr(task, "kind", None) != "rerank":
            raise OptionsError(f"model: a reranker needs a model fine-tuned for rerank (kind='rerank', "
                               f"--task rerank), not {shown(getattr(task, 'kind', task))}", "model")
        # the task's (its folder's) unless given; checked as the task checks it, an OptionsError naming it
        self.task = task
        self.activation = checked_activation(activation or getattr(task, "activation", None), "sigmoid")

    def score(self, logit: float) -> float:
        """A document's score: its logit through the task's activation (sigmoid, or identity: the logit)."""
        return relevance(logit) if self.activation == "sigmoid" else logit

    @classmethod
    def load(cls, model, device: str = "auto") -> "Reranker":
        """A reranker directory (its task.json says rerank), a RerankTask or a Reranker."""
        if isinstance(model, Reranker):
            return model
        if isinstance(model, (str, Path)):
            from lmforge.tasks.finetune import fine_tuned_task

            try:
                return cls(fine_tuned_task(model, [], kind="rerank", device=device).eval())
            except OptionsError:
                raise
            except ValueError:  # said in the task's terms ("never fine-tuned for rerank"): said as one of
                check_reranker(model)  # lmforge.rerank's arguments where the folder is no reranker
                raise
        return cls(model)

    def counts(self, query: str, documents: list) -> list:
        """Tokens of each whole (query, document) pair, specials included."""
        return [len(self.task.tokenizer.encode(query, d).ids) for d in documents]

    def rank(self, query: str, documents: list, options: RerankQueryOptions | None = None,
             batch_size: int = 64) -> list:
        """Ranked documents, best first (top_n of them); a pair over max_len refused unless truncate."""
        options = options or RerankQueryOptions()
        documents, batch_size = _check_request(query, documents, batch_size)
        counts = self.counts(query, documents)
        limit = self.task.max_len
        too_long = next((i for i, n in enumerate(counts) if n > limit), None)
        if too_long is not None and not options.truncate:
            raise OptionsError(f"document {too_long} makes {counts[too_long]} tokens with the query, more "
                               f"than the model's max_len={limit}; truncate=true cuts it", "truncate")
        logits = self.task.pair_scores(query, documents, batch_size)
        ranked = [Ranked(i, self.score(logits[i]), logits[i], min(counts[i], limit), counts[i] > limit)
                  for i in order(logits)]
        return ranked[:options.top_n] if options.top_n else ranked


def check_reranker(model) -> None:
    """Refuse a model folder (or name) that is no reranker, by what its files say (a task.json of kind rerank,
    or a CrossEncoder's head): an OptionsError naming model, for lmforge.rerank and --rerank alike (a
    never fine-tuned folder was a plain ValueError about a random head in Python); a reranker whose
    activation lmforge cannot score with (a CrossEncoder's Tanh) is Reranker.load's ValueError naming the
    file (check_scored), before any weights are read."""
    from lmforge.io import find_model_dir, model_dir
    from lmforge.presets import PRESETS
    from lmforge.tasks.reference import check_scored, fine_tuned_for, task_info

    preset = str(model) in PRESETS  # built untrained: no reranker
    if not preset:
        find_model_dir(model)  # a name of no model: lmforge.load's CheckpointError, as fine_tuned_task says
    path = None if preset else model_dir(model) or model
    info = {} if preset else task_info(path)
    if fine_tuned_for(info, "rerank"):
        check_scored(path, info, "rerank")  # --rerank had let a Tanh through, to fail after the search
        return
    kind, kinds = info.get("kind"), info.get("kinds")
    said = ("a preset, never fine-tuned" if preset else f"its task.json says {kind}" if kind
            else f"its head is read as {' or '.join(kinds)}" if kinds else "no task.json")
    raise OptionsError(f"{model} is not a reranker ({said}); fine-tune one with lmforge finetune --task "
                       "rerank", "model")


def _check_request(query, documents, batch_size) -> tuple:
    """(the documents as a list, batch_size as Python's int): the documents read as embed reads its texts
    (any iterable of texts: a generator, a dataset's column; one text is not a list of them); an
    OptionsError naming the query, the documents or batch_size (embed's bound) where they cannot be scored."""
    batch_size = checked_argument("batch_size", "int", {"low": 1, "high": MAX_BATCH_SIZE}, batch_size)
    if not isinstance(query, str) or not query.strip():
        raise OptionsError("query must be non-empty text", "query")
    checked_text(query, "query")  # a lone surrogate failed in the tokenizer (said as query, not query[0])
    return checked_texts(documents, "documents", one=False), batch_size


@named_keywords("rerank")
def rerank(model, query: str, documents: list, top_n: int | None = None, truncate: bool | None = None,
           batch_size: int = 64) -> list:
    """[(index, score)] of `documents` for `query`, best first (the best `top_n`); `model` is a reranker
    directory (lmforge finetune --task rerank), a RerankTask or a Reranker. The server's /rerank gives the
    same order and scores."""
    options = RerankQueryOptions.build(fields={"top_n": top_n, "truncate": truncate})
    # as given, before the model is read: list("abc") made three documents of one text
    documents, batch_size = _check_request(query, documents, batch_size)
    return [(r.index, r.score) for r in Reranker.load(model).rank(query, documents, options, batch_size)]
