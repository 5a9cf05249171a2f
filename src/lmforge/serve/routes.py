"""Routes that answer at once or through batched jobs: embeddings, predictions, fill-mask,
attention views, tokenisation, health, info, the model list and metrics.

A request's texts are counted here with the event loop's own tokenizer (413 past a limit, before
anything is queued), then split into jobs of at most Limits.max_batch_tokens / max_batch_items,
so a client batch beyond the cap is served as several forward passes and answered as one.
"""
from __future__ import annotations

import dataclasses
import time
from urllib.parse import unquote_to_bytes

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, PlainTextResponse

from lmforge.analysis.attention import layer_list, view_depth
from lmforge.config.checks import room_for_text
from lmforge.config.options import OptionsError
from lmforge.pipelines.embed_options import EmbedOptions, prompt_of
from lmforge.pipelines.fill_mask import MASK_SPELLINGS, SENTINEL, check_fill, with_mask
from lmforge.serve import option_schemas, schemas
from lmforge.serve.limits import (RequestError, TextBound, bounded_ids, check_count, check_request_tokens,
                                  check_text, echoed, fit_lengths, read_heads, text_bound, too_large)
from lmforge.serve.records import as_records, choice_tokens, record_texts, record_tokens
from lmforge.serve.schemas import JSONBody

ERRORS = {status: {"model": schemas.ErrorResponse} for status in (400, 404, 413, 422, 429, 503)}
router = APIRouter(responses=ERRORS)
INLINE_COUNT, INLINE_CHARS = 64, 100_000  # counted on the event loop itself; more on a helper thread
VIEW_BYTES = 10_000_000  # an attention view's size limit (analysis/view.py keeps each row's top keys beyond)


def _server(request: Request):
    return request.app.state.server


async def count_tokens(server, served, texts: list, pairs: list | None = None) -> list:
    """Tokens of each text (pair); a long list or long texts are counted off the event loop, so other
    requests are answered meanwhile (the front tokenizer never truncates, so it is safe to share with
    a helper thread, and it lets go of the GIL while it works)."""
    start = time.perf_counter()
    chars = sum(map(len, texts)) + (sum(len(p or "") for p in pairs) if pairs else 0)
    if len(texts) <= INLINE_COUNT and chars <= INLINE_CHARS:
        counts = served.count(texts, pairs)
    else:
        counts = await anyio.to_thread.run_sync(served.count, texts, pairs)
    server.metrics.observe("lmforge_phase_seconds", time.perf_counter() - start, phase="tokenize")
    return counts


def split(items: list, lengths: list, limits) -> list:
    """Consecutive runs of `items` within the batch budget: [(items, tokens)]."""
    parts, run, tokens = [], [], 0
    for item, n in zip(items, lengths):
        if run and (tokens + n > limits.max_batch_tokens or len(run) >= limits.max_batch_items):
            parts.append((run, tokens))
            run, tokens = [], 0
        run.append(item)
        tokens += n
    if run:
        parts.append((run, tokens))
    return parts


async def clip(server, served, texts: list, truncate: bool, limit=None) -> tuple:
    """(texts, token counts), a text far longer than the model reads cut before it is tokenised:
    its first MAX_TOKEN_CHARS x `limit` characters (tokens, default the model's max_tokens, or a TextBound
    that names them, less a word cut at the end: limits.read_heads) already hold more tokens than that (the
    same first tokens: pre-tokenisers split locally), so the rest is never read; without `truncate` it is a
    413 at once."""
    bound = text_bound(limit or served.max_tokens)
    heads, counts = await read_heads(lambda some: count_tokens(server, served, some), texts, bound.tokens)
    for i, text in enumerate(texts):
        if len(heads[i]) < len(text) and not truncate:  # a head of more than bound.tokens tokens
            raise bound.refuse(i, f"more than {counts[i]} tokens (its first {len(heads[i])} of {len(text)} "
                                  "characters)")
    return heads, counts


def build_options(cls, body):
    """The options object `cls` of a request's fields (every field of `cls`; a null one is not given): a bad
    value is a 422 naming the field, as the library's OptionsError names it."""
    try:
        return cls.build(fields={f.name: getattr(body, f.name) for f in dataclasses.fields(cls)})
    except OptionsError as err:
        raise RequestError(422, str(err), param=err.field) from None


def length_bound(asked: int | None, served) -> TextBound:
    """The tokens a text may have (/embed's and /features' max_length): the request's `asked` where it is
    below the model's (and then named as the field at fault), else the model's max_tokens (/info's)."""
    most = served.max_tokens
    if asked is not None and served.tokenizer is not None:  # refused as offline: past the positions, no room
        try:
            room_for_text("max_length", asked, served.model.config,
                          served.tokenizer.backend.num_special_tokens_to_add(False))
        except OptionsError as err:
            raise RequestError(422, str(err), param="max_length") from None
    if asked is None or asked >= most:
        return TextBound(most)
    return TextBound(asked, f"max_length={asked} (the model takes max_tokens={most}, /info)", "max_length")


async def embed_texts(server, served, texts: list, options, field: str = "input") -> tuple:
    """(vectors in the options' encoding, tokens read, each input's InputInfo) of `texts`, batched with
    whatever else is queued for the model with the same options."""
    check_count(len(texts), server.limits, field)
    bound, chunk = length_bound(options.max_length, served), options.truncate == "chunk"
    try:
        prefix = prompt_of(options, served.encoder.prompts, served.encoder.default_prompt)
        # as lmforge.embed refuses it, counted by the event loop's tokenizer (the workers' waits on a lock)
        length = served.encoder.prompt_length(prefix, served.front)
        served.encoder.check_prompt_room(length, options, bound.tokens)
        options = dataclasses.replace(options, prompt="", prompt_name=None)  # the prefix is in the texts now
    except OptionsError as err:
        raise RequestError(422, str(err), param=err.field) from None
    most = bound.tokens * options.chunk_limit() if chunk else bound
    # counted, clipped and sent as the model reads them (lowercased where it lowercases, as embed_with does;
    # here only: embed_counted reads them as given):
    # counted as sent, a cased tokenizer's 14-token text was a 413 of 44 tokens, which Python reads whole
    lowered = [(prefix + t).lower() if served.encoder.lowercase else prefix + t for t in texts]
    texts, counts = await clip(server, served, lowered, bool(options.truncate), most)
    if chunk and any(n > most for n in counts):
        raise RequestError(422, f"an input is more than max_chunks={options.chunk_limit()} windows of "
                           f"{bound.tokens} tokens", param="max_chunks")
    lengths = fit_lengths(counts, most, bool(options.truncate), server.limits)
    # the prompt's leading tokens (its options carry no prompt: a batch mixes requests of different prompts,
    # each text with its own lead); embed_counted's _skip alone decides whether the model leaves them out
    lead = 0 if length is None else length.lead
    # the counts go along, so the worker does not count again
    parts = [({"texts": [texts[i] for i in run], "options": options, "leads": [lead] * len(run),
               "counts": [counts[i] for i in run]}, n, len(run))
             for run, n in split(list(range(len(texts))), lengths, server.limits)]
    results = await server.run("embed", served, parts, key=("embed", served.name, repr(options)),
                               interleave=True)
    found = [v for part in results for v in part]
    return [f[0] for f in found], sum(lengths), [f[1] for f in found]  # tokens read: after any cut


@router.post("/v1/embeddings", response_model=schemas.EmbeddingsResponse, tags=["embeddings"])
async def embeddings(body: option_schemas.EmbeddingsRequest, request: Request):
    """OpenAI-compatible embeddings of a text or a list of texts, with /embed's options (dimensions:
    Matryoshka)."""
    server = _server(request)
    served = server.pick(body.model, "embed")
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not all(isinstance(t, str) for t in texts):
        raise RequestError(422, "input: token ids are not accepted (they would be another tokenizer's); "
                           "send text (LangChain: check_embedding_ctx_length=False)", param="input")
    options = build_options(EmbedOptions, body)  # every field, as /embed takes them: none ignored
    vectors, tokens, _ = await embed_texts(server, served, texts, options)
    data = [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)]
    return JSONBody({"object": "list", "data": data, "model": served.name,
                     "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


@router.post("/embed", response_model=option_schemas.EmbedResponse, tags=["embeddings"])
async def embed(body: option_schemas.EmbedRequest, request: Request):
    """Sentence embeddings (lmforge.embed): one vector per text, in order, with each input's tokens."""
    server = _server(request)
    served = server.pick(body.model, "embed")
    texts = [body.texts] if isinstance(body.texts, str) else body.texts
    options = build_options(EmbedOptions, body)
    vectors, tokens, inputs = await embed_texts(server, served, texts, options, "texts")
    return JSONBody({"model": served.name, "embeddings": vectors, "encoding_format": options.encoding_format,
                     "dim": inputs[0]["dim"] if inputs else 0, "tokens": tokens,
                     "inputs": [{k: i[k] for k in ("tokens", "truncated", "chunks")} for i in inputs]})


def record_bound(task, truncate: bool, limits) -> tuple:
    """(the TextBound of a task's record, whether it may be cut): QA reads every token of a long context in
    overlapping windows (a record counts what they hold: record_tokens), so truncate cuts nothing and only
    the request's limit bounds it; the other tasks read the first max_len tokens of a record (task.json's)."""
    if task.kind == "qa":
        most = limits.max_request_tokens
        said = f"max_request_tokens={most} (QA reads the whole context, in windows that overlap)"
        return TextBound(most, said, "max_request_tokens", cut=False), False
    field = "input {} (the text with its longest choice)" if task.kind == "choice" else "input {}"
    return TextBound(task.max_len, f"the task reads, max_len={task.max_len}", field=field), truncate


async def record_lengths(server, served, records: list, truncate: bool) -> list:
    """The tokens each record costs (after any cut), 413 past the task's bound or the request's."""
    task = served.task
    texts = [record_texts(task, r) for r in records]
    flat = await count_tokens(server, served, [t for ts in texts for t, _ in ts],
                              [p for ts in texts for _, p in ts])
    counts, at = [], 0
    for ts in texts:
        counts.append(flat[at:at + len(ts)])
        at += len(ts)
    bound, cut = record_bound(task, truncate, server.limits)
    lengths = fit_lengths([record_tokens(task, c) for c in counts], bound, cut, server.limits)
    if task.kind == "choice":  # each choice is a sequence of its own: the record pays for them all
        lengths = [choice_tokens(c, bound.tokens) for c in counts]
        check_request_tokens(sum(lengths), server.limits, " (each choice read with its text)")
    return lengths


@router.post("/predict", response_model=schemas.PredictResponse, tags=["tasks"])
async def predict(body: schemas.PredictRequest, request: Request):
    """A fine-tuned model's predictions (labels and scores; spans for QA; tags for tagging)."""
    server = _server(request)
    served = server.pick(body.model, "predict")
    task = served.task
    records = as_records(task.kind, body.inputs)
    check_count(len(records), server.limits, "inputs")
    lengths = await record_lengths(server, served, records, body.truncate)
    parts = [({"records": run}, n, len(run)) for run, n in split(records, lengths, server.limits)]
    results = await server.run("predict", served, parts, key=("predict", served.name),
                               interleave=task.kind != "seq2seq")
    predictions = [p for part in results for p in part]
    return JSONBody({"model": served.name, "task": task.kind, "predictions": predictions})


def one_mask(served, text: str) -> None:
    """422 naming text unless it holds exactly one mask, counted as the pipeline counts it (every spelling
    of the mask taken for the model's own: T5's first sentinel, else the tokenizer's mask token)."""
    front, seq2seq = served.front, served.model.config.architecture == "encoder-decoder"
    spans = seq2seq and front.token_to_id(SENTINEL) is not None
    token = SENTINEL if spans else front.special_tokens.get("mask") or MASK_SPELLINGS[0]
    try:
        with_mask(text, token)
    except ValueError as err:
        raise RequestError(422, f"text: {err}", param="text") from None


def fill_options(body, limits) -> tuple:
    """(top_k, max_span) of a fill-mask request: past the server's max_top_k a 413 naming it, checked first
    as /generate checks max_new_tokens against its limit (a server may allow fewer than FillOptions), then
    FillOptions' checks, lmforge.fill_mask's: a 422 naming the field, in the library's words."""
    if body.top_k > limits.max_top_k:
        raise too_large("max_top_k", f"top_k={echoed(body.top_k)} is more than max_top_k={limits.max_top_k}")
    try:
        return check_fill(body.top_k, body.max_span)
    except OptionsError as err:
        raise RequestError(422, str(err), param=err.field) from None


@router.post("/fill_mask", response_model=schemas.FillMaskResponse, tags=["masked language models"])
async def fill_mask(body: option_schemas.FillMaskRequest, request: Request):
    """The top-k fillings of the one [MASK] / <mask> (MLM encoders, T5, BART)."""
    server = _server(request)
    served = server.pick(body.model, "fill_mask")
    top_k, max_span = fill_options(body, server.limits)
    one_mask(served, body.text)
    bound = TextBound(served.max_tokens, cut=False, field="text")
    # its head only, as /embed's and /features' texts: a 4 MB text was tokenized whole (4.6 s) for the 413
    _, counts = await clip(server, served, [body.text], False, bound)
    (n,) = fit_lengths(counts, bound, False, server.limits)
    span = min(max_span, served.max_tokens)
    payload = {"text": body.text, "top_k": top_k, "max_span": span}
    (candidates,) = await server.run("fill_mask", served, [(payload, n + span * top_k, 1)])
    return JSONBody({"model": served.name, "candidates": candidates})


def parse_layers(text: str | None, model, limits) -> list | None:
    """?layers=0,3,5 or 2-5 (or both: 0,2-5) as the command line's --layers reads them (layer_list: sorted
    indices, each checked against the model before any range is made); None (left out or empty) for every
    layer. 413 past max_layers, 422 for what names no layer of the model."""
    if not text:
        if view_depth(model) > limits.max_layers:
            raise too_large("max_layers", f"the model has {view_depth(model)} layers, more than max_layers="
                            f"{limits.max_layers}: choose some with layers=")
        return None
    if text.count(",") >= limits.max_layers:  # counted before a part is made
        raise too_large("max_layers", f"layers: more than max_layers={limits.max_layers} layers asked")
    try:
        chosen = layer_list(text, view_depth(model))
    except OptionsError as err:
        raise RequestError(422, f"layers={err}", param="layers") from None
    if len(chosen) > limits.max_layers:
        raise too_large("max_layers",
                        f"layers: {len(chosen)} layers asked, more than max_layers={limits.max_layers}")
    return chosen


def check_query(query: bytes, known: tuple) -> None:
    """422 naming the first parameter of the raw `query` that is unknown (as a JSON body's unknown field
    is: a misspelt option is not silently ignored), given twice (one of its values would be dropped
    unsaid) or not UTF-8 (it would be read with U+FFFD in place of its bytes)."""
    seen = set()
    for pair in filter(None, query.split(b"&")):
        raw_name, _, raw_value = pair.partition(b"=")
        name = unquote_to_bytes(raw_name.replace(b"+", b" ")).decode("utf-8", "replace")
        if name not in known:
            said = f"known: {', '.join(known)}" if known else "this route reads none; a POST's go in its body"
            raise RequestError(422, f"unknown query parameter {name[:100]!r} ({said})", param=name[:100])
        if name in seen:
            raise RequestError(422, f"{name}: given twice in the query; send it once", param=name)
        seen.add(name)
        try:
            unquote_to_bytes(raw_value.replace(b"+", b" ")).decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(422, f"{name}: not valid Unicode (bytes that are not UTF-8, or a lone "
                               "surrogate such as %ED%A0%80)", param=name) from None


@router.get("/attention", response_class=HTMLResponse, tags=["analysis"],
            responses={200: {"content": {"text/html": {}},
                             "description": "the self-contained attention view"}})
async def attention(request: Request, text: str = Query(..., description="the text whose attention to show"),
                    text_pair: str | None = Query(None, description="a second segment (encoder-decoders: "
                                                  "the decoder's text; default its greedy continuation)"),
                    model: str | None = Query(None, description="a served model's name"),
                    layers: str | None = Query(None,
                                               description="layers to show, 0,3,5 or 2-5 (default all)")):
    """The attention view of one text (head, model and neuron views; offline HTML, at most 10 MB)."""
    # its query is checked by app.Guard, as every API route's is
    server = _server(request)
    served = server.pick(model, "attention")
    chosen = parse_layers(layers, served.model, server.limits)
    if not text.strip():  # the library's refusal would name no field
        raise RequestError(422, "text is empty: send the text whose attention to show", param="text")
    if text_pair is not None and not text_pair.strip():  # nor would its refusal of an empty pair
        raise RequestError(422, "text_pair is empty: send the second text, or leave it out",
                           param="text_pair")
    check_text("text", text, server.limits)
    counts = await count_tokens(server, served, [text], None if text_pair is None else [text_pair])
    field = "text" if text_pair is None else "text with text_pair"
    (n,) = fit_lengths(counts, TextBound(served.max_tokens, cut=False, field=field), False, server.limits)
    payload = {"text": text, "text_pair": text_pair, "layers": chosen, "max_bytes": VIEW_BYTES}
    (page,) = await server.run("attention", served, [(payload, n, 1)])
    return HTMLResponse(page)


@router.post("/tokenize", response_model=schemas.TokenizeResponse, tags=["tokens"])
async def tokenize(body: schemas.TokenizeRequest, request: Request):
    """The model's token ids and token strings of a text."""
    server = _server(request)
    served = server.pick(body.model, "tokenize")

    def encode(text: str) -> list:
        return served.front.encode(text, add_special_tokens=body.add_special_tokens).ids

    def split_text() -> tuple:
        ids = bounded_ids("text", encode, body.text, server.limits)  # before a string is made for each
        return ids, [served.front.id_to_token(i) or "" for i in ids]

    ids, tokens = await anyio.to_thread.run_sync(split_text)  # a long text: the event loop answers meanwhile
    return JSONBody({"model": served.name, "ids": ids, "tokens": tokens, "count": len(ids)})


@router.get("/health", response_model=schemas.HealthResponse, tags=["server"])
async def health(request: Request):
    """Whether the server takes work ("draining" during shutdown)."""
    server = _server(request)
    status = "draining" if server.admission.closing else "ok"
    return {"status": status, "models": list(server.models), "queue": server.admission.pending}


@router.get("/info", response_model=schemas.InfoResponse, tags=["server"])
async def info(request: Request):
    """The served models (capabilities, limit, config, task), the limits, the threads and workers."""
    from lmforge import __version__

    server = _server(request)
    return {"version": __version__, "models": {name: m.describe() for name, m in server.models.items()},
            "limits": server.limits.as_dict(), "threads": server.threads, "workers": server.n_workers,
            "threads_per_worker": server.worker_threads}


@router.get("/v1/models", response_model=schemas.ModelList, tags=["server"])
async def models(request: Request):
    """The served models as OpenAI's model list (for OpenAI clients that list models first)."""
    server = _server(request)
    return {"object": "list", "data": [{"id": name, "object": "model", "created": server.started,
                                        "owned_by": "lmforge", "capabilities": list(m.capabilities)}
                                       for name, m in server.models.items()]}


@router.get("/metrics", response_class=PlainTextResponse, tags=["server"],
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format 0.0.4"}})
async def metrics(request: Request):
    """Counters, gauges and histograms in the Prometheus text format."""
    server = _server(request)
    server.gauges()
    return PlainTextResponse(server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
