"""Rerank routes: POST /rerank and POST /v1/rerank (Jina's and Cohere's shape) score a query against
documents with a served reranker (task.json kind rerank) and answer them best first.

    {"model", "query", "documents": ["...", {"text": "..."}], "top_n", "return_documents", "truncate"}
    -> {"model", "results": [{"index", "relevance_score", "truncated", "document": {"text"}?}], "usage"}

The request's settings are pipelines/rerank.py's RerankQueryOptions, as `lmforge.rerank` takes them, and the
scores are computed as there (Reranker: the logit through the task's activation, sigmoid by default or a
CrossEncoder's activation_fn, ordered by logit), so the two answer alike.
The limits speak before any work: 413 past max_documents, a pair past the model's max_len without truncate
(max_seq_len) or a request past max_request_tokens; each pair's tokens are counted on the event loop's
tokenizer, and the pairs run batched with other requests' pairs of the same model.
"""
from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, create_model

from lmforge.pipelines.rerank import RerankQueryOptions, order
from lmforge.serve import job_kinds
from lmforge.serve.limits import (MAX_TOKEN_CHARS, RequestError, check_count, check_text, fit_lengths,
                                  read_heads, text_head, too_large)
from lmforge.serve.option_schemas import options_fields
from lmforge.serve.routes import ERRORS, build_options, count_tokens, split
from lmforge.serve.schemas import EXACT, MODEL_FIELD, SOME, JSONBody

router = APIRouter(responses=ERRORS)


class RerankDocument(BaseModel):
    """A document given as an object (Jina's and Cohere's {"text": ...})."""

    model_config = EXACT
    text: str


class RerankBase(BaseModel):
    """A query, the documents to score against it, and the reranker that reads them."""

    model_config = EXACT
    query: str = Field(..., description="the query (or question): not empty or blank",
                       json_schema_extra={"pattern": r"\S"})
    documents: list[str | RerankDocument] = Field(..., description="texts, or objects {\"text\": ...}; "
                                                  "at most max_documents of them (/info)",
                                                  json_schema_extra=SOME)
    model: str | None = MODEL_FIELD


RerankRequest = create_model("RerankRequest", __base__=RerankBase, __module__=__name__,
                             __doc__="Rerank documents for a query (lmforge.rerank's RerankQueryOptions).",
                             **options_fields(RerankQueryOptions))


class RerankResult(BaseModel):
    """One document: its index in the request, its score (the logit through the checkpoint's activation, as
    lmforge.rerank's), whether it was cut."""

    index: int
    relevance_score: float
    truncated: bool
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    """Tokens read, every (query, document) pair after truncation."""

    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    """The documents best first (the best top_n)."""

    model: str
    results: list[RerankResult]
    usage: RerankUsage


def rerank_batch(served, payloads: list) -> list:
    """The logits of every job's (query, document) pairs from one pass of the task (Task.outputs)."""
    task = served.task
    examples = [{"pairs": [task.encode_text(p["query"], d)]} for p in payloads for d in p["documents"]]
    logits = [s[0] for s in task.outputs(examples, batch_size=max(1, len(examples)))]
    out, at = [], 0
    for p in payloads:
        out.append(logits[at:at + len(p["documents"])])
        at += len(p["documents"])
    return out


job_kinds.BATCHED["rerank"] = rerank_batch  # the workers' table of batched jobs: this route's kind


async def _query_head(served, query: str, limit: int) -> tuple:
    """(the query as far as any pair reads it, its tokens): no pair of max_len `limit` keeps a token past its
    first `limit` (MAX_TOKEN_CHARS characters more keep the word at the cut whole). Each document's pair
    tokenized the whole head, limit x 128 characters: 1,024 documents and a 64 KB query took 39 s of the
    server's tokenizer before the 413 for max_request_tokens. Its first limit x 128 characters are read
    first; where they hold no more than `limit` tokens (mostly whitespace) the whole query decides."""
    def spans(texts: list) -> list:
        return [served.front.encode(text, None, False).offsets for text in texts]

    (head,), (found,) = await read_heads(lambda some: anyio.to_thread.run_sync(spans, some), [query], limit,
                                         size=len)
    if len(found) > limit:  # whole words again: its tokens are those of the query's that end in it
        head = text_head(head, found[limit - 1][1] + MAX_TOKEN_CHARS)
        found = [span for span in found if span[1] <= len(head)]
    return head, len(found)


async def _pair_lengths(server, served, query: str, documents: list, truncate: bool) -> tuple:
    """(documents cut to what the model can read, each pair's tokens within max_len, each pair's whole
    count)."""
    limit = served.task.max_len
    query, taken = await _query_head(served, query, limit)
    taken += served.front.backend.num_special_tokens_to_add(True)  # a pair's tokens besides the document's
    heads, counts = await read_heads(lambda some: count_tokens(server, served, [query] * len(some), some),
                                     documents, limit, taken)
    try:
        lengths = fit_lengths(counts, limit, truncate, server.limits)
    except RequestError as err:
        if err.param != "max_seq_len":
            raise
        i = next(i for i, n in enumerate(counts) if n > limit)
        raise too_large("max_seq_len", f"documents.{i}: with the query it is {counts[i]} tokens, "
                        f"more than the reranker's max_len={limit}; send truncate: true to cut it") from None
    return query, heads, lengths, counts


@router.post("/rerank", response_model=RerankResponse, tags=["rerank"])
@router.post("/v1/rerank", response_model=RerankResponse, tags=["rerank"])
async def rerank(body: RerankRequest, request: Request):
    """A reranker's relevance of each document to the query, best first (Jina / Cohere rerank shape)."""
    server = request.app.state.server
    served = server.pick(body.model, "rerank")
    options = build_options(RerankQueryOptions, body)
    documents = [d if isinstance(d, str) else d.text for d in body.documents]
    check_count(len(documents), server.limits, "documents", "max_documents")
    if not body.query.strip():
        raise RequestError(422, "query: send a non-empty query", param="query")
    check_text("query", body.query, server.limits)
    query, heads, lengths, counts = await _pair_lengths(server, served, body.query, documents,
                                                        options.truncate)
    parts = [({"query": query, "documents": run}, n, len(run))
             for run, n in split(heads, lengths, server.limits)]
    results = await server.run("rerank", served, parts, key=("rerank", served.name), interleave=True)
    logits = [s for part in results for s in part]
    ranked = order(logits)[:options.top_n] if options.top_n else order(logits)
    answer = [{"index": i, "relevance_score": served.score(logits[i]),
               "truncated": counts[i] > served.task.max_len,
               **({"document": {"text": documents[i]}} if options.return_documents else {})} for i in ranked]
    tokens = sum(lengths)
    return JSONBody({"model": served.name, "results": answer,
                     "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
