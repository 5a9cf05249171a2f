"""Generation routes: /generate (lmforge's) and /v1/completions (OpenAI's), whole or as server-sent
events (`data: {json}` per new token, then `data: [DONE]`).

A streamed request waits for its first event before answering, so an error found before any
token (a bad setting, a prompt too long) is a proper HTTP error, not a 200 that fails inside; one found
later (a refusal, or an error the server did not expect: its 500's body) is the last event, with no
[DONE] after it, so a stream that ends without [DONE] is never taken for a whole answer. A
client that disconnects cancels its job: a stream's generator is closed by Starlette's
disconnect listener (before its first event, by the watcher below), a whole answer's by the watcher;
either way the worker stops before its next decoding step, or never starts a job still queued.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid

import anyio

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from lmforge.config.options import OptionsError
from lmforge.generate.checks import check_prefix_lm
from lmforge.generate.options import refuse_unused
from lmforge.generate.stops import StopLimitError, check_stops
from lmforge.serve import schemas
from lmforge.generate.recommended import recommendation
from lmforge.generate.text import prompt_ids
from lmforge.serve.generation import Settings
from lmforge.serve.generation_schemas import (DECODING, CompletionRequest, CompletionResponse,
                                             GenerateRequest, GenerateResponse)
from lmforge.serve.limits import (RequestError, bounded_ids, check_count, check_generation,
                                  check_request_tokens, server_error, too_large)
from lmforge.serve.schemas import JSONBody
from lmforge.serve.worker import Cancelled

ERRORS = {status: {"model": schemas.ErrorResponse} for status in (400, 404, 413, 422, 429, 503)}
router = APIRouter(responses=ERRORS, tags=["generation"])
SSE = {"text/event-stream": {"schema": {"type": "string",
                                        "description": "data: {json} events, then data: [DONE]"}}}
INLINE_CHARS = 10_000  # a prompt tokenized on the event loop itself; longer ones (or several): a thread
LOG = logging.getLogger("uvicorn.error")  # the server's log (app.py's)


def settings_of(body, max_new_tokens: int, limits, new_tokens: str = "max_new_tokens",
                defaults: dict | None = None, unsampled_seed: bool = False) -> Settings:
    """The request's decoding settings, checked against the limits (before any work) and each other;
    `defaults`: the route's own, where neither the request nor the served model's checkpoint states one."""
    check_generation(body, max_new_tokens, limits, new_tokens)
    try:  # the rule lmforge generate --stop follows, within this server's limits
        stops = check_stops(body.stop, limits.max_stop, limits.max_stop_chars)
    except StopLimitError as err:
        raise too_large(err.limit, str(err)) from None
    except OptionsError as err:  # an empty one would be found before the first token: refused, not dropped
        raise RequestError(422, f"{err.field}: {err}", param=err.field) from None
    given = body.model_fields_set
    if body.num_beams > 1 and body.temperature > 0 and "temperature" in given:
        raise RequestError(422, "num_beams > 1 needs temperature 0: beam search does not sample",
                           param="num_beams")
    # the values the request gave: the rest are the served model's recommendation's, else the defaults
    fields = {name: getattr(body, name) for name in (*DECODING, "temperature") if name in given}
    if given & {"max_new_tokens", "max_tokens"}:
        fields["max_new_tokens"] = max_new_tokens
    return Settings(given=fields, defaults=defaults or {}, seed=body.seed, stop=stops,
                    stream=body.stream, new_tokens=new_tokens, unsampled_seed=unsampled_seed,
                    prefix_lm=body.prefix_lm)


def completion_defaults(served) -> dict:
    """/v1/completions' own defaults, beneath a checkpoint's: OpenAI's max_tokens 16, and its temperature 1
    (samples) unless the checkpoint says how to decode (do_sample, temperature or beams)."""
    found = recommendation(served.model)
    stated = found.fields if found is not None else {}
    if stated.keys() & {"do_sample", "temperature", "num_beams"}:
        return {"max_new_tokens": 16}
    return {"max_new_tokens": 16, "do_sample": True, "temperature": 1.0}


async def jobs_of(served, prompts: list, settings: Settings, limits, listed: bool = False,
                  new_tokens: str = "max_new_tokens") -> list:
    """[(payload, tokens)] of the prompts (`listed`: sent as a list, so errors name prompt.i), tokenized
    off the event loop; 413 for a prompt past max_input_tokens, when a prompt and its new tokens
    exceed the model's context, or when the request's tokens (`new_tokens` names its field) exceed
    max_request_tokens."""
    fields = [f"prompt.{i}" if listed else "prompt" for i in range(len(prompts))]
    seq2seq = served.model.config.architecture == "encoder-decoder"

    def encode_all() -> list:
        return [bounded_ids(field, lambda t: prompt_ids(served.front, t, seq2seq), prompt, limits)
                for field, prompt in zip(fields, prompts)]

    if len(prompts) == 1 and len(prompts[0]) <= INLINE_CHARS:
        all_ids = encode_all()
    else:
        all_ids = await anyio.to_thread.run_sync(encode_all)
    jobs = [_job(served, field, ids, settings, limits, new_tokens) for field, ids in zip(fields, all_ids)]
    check_request(all_ids, [payload["options"] for payload, _ in jobs], limits, new_tokens)
    return jobs


def check_request(all_ids: list, options: list, limits, new_tokens: str = "max_new_tokens") -> None:
    """413 naming max_request_tokens when the prompts' tokens and each one's new tokens, times the beams
    (each beam holds its own sequence), exceed it; `options`: each prompt's GenerationOptions."""
    read = sum(map(len, all_ids))
    total = sum((len(ids) + o.max_new_tokens) * o.num_beams for ids, o in zip(all_ids, options))
    beams, most = max(o.num_beams for o in options), max(o.max_new_tokens for o in options)
    times = f", times num_beams={beams}" if beams > 1 else ""
    check_request_tokens(total, limits, f": {len(all_ids)} prompt(s) of {read} tokens, plus {new_tokens}="
                         f"{most} for each{times}")


def _job(served, field: str, ids: list, settings: Settings, limits=None,
         new_tokens: str = "max_new_tokens") -> tuple:
    model = served.model
    if not ids:
        raise RequestError(422, f"{field}: the prompt is empty: a decoder needs at least one token",
                           param=field)
    context = model.config.max_seq_len
    # decoder positions before the new tokens (the last new token is never fed back)
    start = 1 if model.config.architecture == "encoder-decoder" else len(ids)
    options = settings.options_for(model, served.front, start, str(served.path))
    try:  # prefix_lm for an encoder-decoder: refused before the job is queued, as Python refuses it
        check_prefix_lm(model, settings.prefix_lm)
    except OptionsError as err:
        raise settings.refusal(err) from None
    try:  # a setting the request gave that its decoding would not read: refused as the other faces do, once
        # the route's defaults and the checkpoint's recommendation say whether it samples (OpenAI's samples)
        refuse_unused(options, settings.given, None if settings.unsampled_seed else settings.seed)
    except OptionsError as err:
        raise settings.refusal(err) from None
    if limits is not None:  # the checkpoint's settings are bounded as a request's are
        check_generation(options, options.max_new_tokens, limits, new_tokens)
    if options.num_beams > 1 and settings.stream:
        whose = "" if "num_beams" in settings.given else \
            f" (the model recommends num_beams={options.num_beams})"
        raise RequestError(422, "stream needs num_beams 1: beam search knows its best text only at the end"
                           + whose, param="stream")
    if len(ids) > context or start + options.max_new_tokens - 1 > context:
        raise too_large("max_seq_len", f"{field}: the prompt of {len(ids)} tokens plus {new_tokens}="
                        f"{options.max_new_tokens} exceed the model's context, max_seq_len={context}")
    # the tokens check_request counts, so the queue's backlog (Retry-After, the gauges) weighs beams too
    payload = {"ids": ids, "settings": settings, "options": options}
    return payload, (len(ids) + options.max_new_tokens) * options.num_beams


async def _unless_gone(request: Request, awaitable):
    """`awaitable`'s result; if the client disconnects first, it is cancelled (Server.run and Server.stream
    then cancel their jobs on their way out) and Cancelled raised."""
    task = asyncio.ensure_future(awaitable)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():  # the client has gone
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise Cancelled()  # app.py's handler: one log line, a 499 nobody reads
    return task.result()


async def _whole(server, served, request: Request, payload: dict, tokens: int) -> dict:
    """Run one generation to its end; a client that disconnects meanwhile cancels it."""
    return (await _unless_gone(request, server.run("generate", served, [(payload, tokens, 1)])))[0]


def sse(data) -> str:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def _events(server, served, request: Request, payloads: list, shape):
    """A StreamingResponse over the prompts' events, each turned into a chunk by `shape`; the first
    event is awaited here so that an early error is an HTTP error, and a client that hangs up while it
    waits in the queue for it cancels its job (it held its place there, then ran a step for nobody).
    All the prompts are admitted at once: one 429 before any runs, never one in the middle of a stream."""
    release = server.admit(sum(tokens for _, tokens in payloads))
    streams = [server.stream(served, payload, tokens) for payload, tokens in payloads]
    try:
        first = await _unless_gone(request, streams[0].__anext__())
    except BaseException:
        release()
        raise

    async def body():
        try:
            yield sse(shape(0, first))
            for index, stream in enumerate(streams):
                async for event in stream:
                    yield sse(shape(index, event))
            yield sse("[DONE]")
        except RequestError as err:  # found after the answer began: the last event says so, no [DONE]
            yield sse(err.body())
        except Exception as err:  # told as a 500 would tell it: a stream cut short would look whole
            LOG.exception("lmforge serve: a streamed generation failed")
            yield sse(server_error(err).body())
        finally:
            for stream in streams:
                await stream.aclose()

    return AdmittedStream(body(), release, media_type="text/event-stream",
                          headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class AdmittedStream(StreamingResponse):
    """A streamed answer that counts its request out of the queue when it ends, however it ends: sent
    whole, cut short, or its client gone before the body began. Its body's own `finally` is not enough:
    Starlette may never start a body whose client has already left."""

    def __init__(self, content, release, **kwargs) -> None:
        super().__init__(content, **kwargs)
        self.release = release

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()


class CompletionChunks:
    """Turns a prompt's events into OpenAI completion chunks (the first one led by the prompt with echo). The
    stream's last chunk has the request's usage, summed over its prompts as the whole reply's is; a prompt's
    own last chunk before it has none (its count there read as the request's, or summed with the total,
    would be wrong)."""

    def __init__(self, head: dict, echo: list | None, prompts: int = 1) -> None:
        self.head, self.echo, self.echoed, self.prompts = head, echo, set(), prompts
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}

    def __call__(self, index: int, event: dict) -> dict:
        """The chunk of one event of prompt `index`."""
        done = event.get("result")
        text = "" if done else event["text"]
        if self.echo is not None and index not in self.echoed:
            self.echoed.add(index)
            text = self.echo[index] + text
        choice = {"text": text, "index": index, "logprobs": None,
                  "finish_reason": done["finish_reason"] if done else None,
                  "token_ids": [] if done else event["token_ids"], **({"seed": done["seed"]} if done else {})}
        if done:  # the prompts stream one after another: the last one's end is the stream's
            self.usage = {k: n + done["usage"][k] for k, n in self.usage.items()}
        last = done and index == self.prompts - 1
        return {**self.head, "choices": [choice], **({"usage": self.usage} if last else {})}


@router.post("/generate", response_model=GenerateResponse, responses={200: {"content": SSE}})
async def generate(body: GenerateRequest, request: Request):
    """Continue a prompt: greedy (temperature 0), sampling, or beam search; stop strings; stream."""
    server = request.app.state.server
    served = server.pick(body.model, "generate")
    settings = settings_of(body, body.max_new_tokens, server.limits)
    ((payload, tokens),) = await jobs_of(served, [body.prompt], settings, server.limits)
    if body.stream:
        def shape(index, event):
            return {"model": served.name, **event["result"]} if "result" in event else event
        return await _events(server, served, request, [(payload, tokens)], shape)
    return JSONBody({"model": served.name, **await _whole(server, served, request, payload, tokens)})


@router.post("/v1/completions", response_model=CompletionResponse, responses={200: {"content": SSE}})
async def completions(body: CompletionRequest, request: Request):
    """OpenAI-compatible completions (one choice per prompt), whole or streamed."""
    server = request.app.state.server
    served = server.pick(body.model, "generate")
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    check_count(len(prompts), server.limits, "prompt")  # none: 422; over max_inputs: 413
    settings = settings_of(body, body.max_tokens, server.limits, "max_tokens", completion_defaults(served),
                           unsampled_seed=True)  # OpenAI's route takes a seed with temperature 0
    listed = not isinstance(body.prompt, str)
    jobs = await jobs_of(served, prompts, settings, server.limits, listed, new_tokens="max_tokens")
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": served.name}
    if body.stream:
        return await _events(server, served, request, jobs,
                             CompletionChunks(head, prompts if body.echo else None, len(prompts)))
    # all the prompts admitted at once (one 429 before any runs, never one after the first ones ran)
    results = await _unless_gone(request, server.run("generate", served, [(p, n, 1) for p, n in jobs]))
    choices = [{"text": (p if body.echo else "") + r["text"], "index": i, "logprobs": None,
                "finish_reason": r["finish_reason"], "token_ids": r["token_ids"], "seed": r["seed"]}
               for i, (p, r) in enumerate(zip(prompts, results))]
    usage = {k: sum(r["usage"][k] for r in results)
             for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    return JSONBody({**head, "choices": choices, "usage": usage})
