"""The FastAPI application: its state (models, limits, queue, worker, metrics), middleware and errors.

    from lmforge.serve import create_app, load_served
    app = create_app({"minilm": load_served("minilm", "all-MiniLM-L6-v2")})
    uvicorn.run(app, host="127.0.0.1", port=8000, http="h11", h11_max_incomplete_event_size=HEAD_BYTES)

(serve/limits.HEAD_BYTES, as `lmforge serve` runs it: a head the app bounds reaches the app, which says
414 or 431 in its JSON; under h11's default 16 KiB a head sent in pieces past that is a plain-text 400.)

The event loop admits a request (the bounded queue's 429), counts its tokens (413 beyond the
limits), splits it into budget-sized jobs and awaits them; the worker threads (worker.py) run
them. On shutdown (uvicorn's SIGTERM handling) the server stops accepting connections, every
admitted request is answered, then the workers drain the queue and stop.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from lmforge import __version__
from lmforge.config.options import OptionsError
from lmforge.serve import feature_routes, page, rerank_routes, routes, streaming
from lmforge.serve.body import Pending, Share, checked_body, header_map
from lmforge.serve.jobs import Job, JobQueue
from lmforge.serve.limits import Admission, Limits, RequestError, check_head, echoed, server_error
from lmforge.serve.metrics import Metrics
from lmforge.serve.schemas import JSONBody
from lmforge.serve.worker import Cancelled, Worker, bound_memory

DESCRIPTION = """Inference server for lmforge models: embeddings (OpenAI-compatible; Matryoshka dimensions,
int8 / binary encodings, prompts, chunking), contextual features, reranking, task predictions,
mask filling, generation with server-sent events, attention views, tokenisation, health, info, the
model list (OpenAI's /v1/models) and Prometheus metrics.
Every error body is `{"error": {"message", "type", "param", "code"}}`; 413 names the limit exceeded
and 429 carries Retry-After. A page to try each route is at `/`; this spec offline at `/docs`."""


LOG = logging.getLogger("uvicorn.error")  # uvicorn's own log: on stderr, at --log-level


def check_threads(threads: int | None, workers: int | None = None, default: int | None = None) -> None:
    """An OptionsError naming threads or workers where they cannot be served: torch threads beyond the CPUs
    this process may use only wait on each other (100,000 crashed), and each worker needs a thread of the
    threads given (or of `default`, the CPUs where None)."""
    cpus = len(os.sched_getaffinity(0))
    if threads is not None and (not isinstance(threads, int) or not 1 <= threads <= cpus):
        raise OptionsError(f"threads={threads}: must be between 1 and the CPUs this process may use ({cpus})",
                           "threads")
    most = threads if threads is not None else default or cpus
    if workers is not None and (not isinstance(workers, int) or not 1 <= workers <= most):
        raise OptionsError(f"workers={workers}: must be between 1 and the threads ({most}), each worker "
                           "running on its share of them", "workers")


class Server:
    """The application's state: served models, limits, admission, the job queue and its workers."""

    def __init__(self, models: dict, limits: Limits | None = None, threads: int | None = None,
                 workers: int | None = None) -> None:
        if not models:
            raise ValueError("serve needs at least one model")
        self.models, self.limits = dict(models), limits or Limits()
        check_threads(threads, workers, torch.get_num_threads())
        self.threads = torch.get_num_threads() if threads is None else threads
        self.n_workers = default_workers(self.models, self.threads) if workers is None else workers
        self.worker_threads = split_threads(self.threads, self.n_workers)
        self.metrics, self.admission, self.queue = Metrics(), Admission(self.limits), JobQueue()
        self.pending = Pending(self.limits.max_pending_bytes)  # request bodies' bytes held (Guard)
        self.workers = [Worker(self.queue, self.limits, self.metrics, self.admission, threads,
                               batched_only=i > 0, share=threads / self.threads,
                               name="lmforge-serve-worker" + (f"-{i}" if i else ""))
                        for i, threads in enumerate(self.worker_threads)]
        self.routes: set = set()  # the app's paths, filled by create_app
        self.get_routes: set = set()  # those answering GET: HEAD is answered as GET without the body
        self.queries: dict = {}  # an API route's path -> the query parameters it reads (Guard refuses others)
        self.started = int(time.time())  # when the models were loaded: /v1/models' "created"

    def start(self) -> None:
        """Set torch's threads for the workers (intra-op, each its share; one inter-op thread), keep large
        blocks out of the C heap and oneDNN's cache of per-shape primitives small (worker.bound_memory:
        their growth under batches of changing shapes; the cache bound takes effect if no forward pass
        has run in this process yet) and start them."""
        torch.set_num_threads(self.worker_threads[0])
        bound_memory()
        for worker in self.workers:
            worker.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Refuse new work, let the workers finish what is queued, and wait for them."""
        self.admission.closing = True
        self.queue.close()
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            if worker.is_alive():
                worker.join(max(0.0, deadline - time.monotonic()))

    def pick(self, name: str | None, capability: str):
        """The model `name` (default: the first one that has `capability`); otherwise 404 (not served), 422
        (the client's model cannot do this: another value of `model` can) or 400 (no served model can)."""
        if name is None:
            found = [m for m in self.models.values() if capability in m.capabilities]
            if not found:
                raise RequestError(400, f"no served model can {capability}", param="model")
            return found[0]
        if name not in self.models:
            raise RequestError(404, f"model {echoed(repr(name))} is not served (served: "
                               f"{', '.join(self.models)})",
                               param="model", kind="model_not_found")
        served = self.models[name]
        if capability not in served.capabilities:
            raise RequestError(422, f"model {name!r} cannot {capability} (it can: "
                               f"{', '.join(served.capabilities)})", param="model")
        return served

    async def run(self, kind: str, served, parts: list, key: tuple | None = None,
                  interleave: bool = False) -> list:
        """Queue one request as jobs, parts = [(payload, tokens, size)]; their results in order."""
        tokens = sum(p[1] for p in parts)
        self._admit(tokens)
        loop = asyncio.get_running_loop()
        jobs = [Job(kind, served, payload, n, size, loop, key=key, interleave=interleave)
                for payload, n, size in parts]
        try:
            for job in jobs:
                self.queue.put(job)
            return list(await asyncio.gather(*(job.future for job in jobs)))
        finally:
            self.admission.release(tokens)
            for job in jobs:
                if not job.future.done() or job.future.cancelled():
                    job.cancel()  # abandoned: the worker skips it or stops it at its next step

    def _admit(self, tokens: int) -> None:
        try:
            self.admission.admit(tokens)
        except RequestError as err:
            self.metrics.inc("lmforge_rejected_total", limit=err.param or err.kind)
            raise

    def admit(self, tokens: int):
        """Count one request in (429 or 503 as Admission.admit says); returns its release, which counts it
        out once, however often it is called (a stream ends by more than one road)."""
        self._admit(tokens)
        released = []

        def release() -> None:
            if not released:
                released.append(True)
                self.admission.release(tokens)
        return release

    async def stream(self, served, payload: dict, tokens: int):
        """Queue a generation job (its request admitted by the caller: Server.admit); yields its events,
        then {"result": ...} (or raises its error)."""
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        job = Job("generate", served, payload, tokens, 1, loop, events=events)
        job.future.add_done_callback(lambda _: events.put_nowait(None))  # after every emitted event
        self.queue.put(job)
        try:
            while (event := await events.get()) is not None:
                yield event
            yield {"result": job.future.result()}
        finally:
            if not job.future.done():
                job.cancel()  # the client went away: the worker stops before the next step
                LOG.info("lmforge serve: a streamed generation was cancelled: its client went away after "
                         "%d steps", job.steps)

    def gauges(self) -> None:
        """Bring the queue gauges up to date (before a scrape)."""
        self.metrics.set("lmforge_queue_requests", self.admission.pending)
        self.metrics.set("lmforge_queue_tokens", self.admission.tokens)
        self.metrics.set("lmforge_queue_jobs", len(self.queue))
        self.metrics.set("lmforge_pending_body_bytes", self.pending.held)


def split_threads(threads: int, workers: int) -> list:
    """Each worker's torch threads: an even share, the first workers one more each where `threads` does
    not divide (3 threads, 2 workers: [2, 1]; none left idle)."""
    return [threads // workers + (i < threads % workers) for i in range(workers)]


def default_workers(models: dict, threads: int) -> int:
    """One worker per thread where no served model generates (batches of embeddings and predictions
    run side by side, one thread each); one worker with every thread where one does (a decoding step
    is latency: it wants all the cores)."""
    return 1 if any("generate" in m.capabilities for m in models.values()) else threads


class Guard:
    """ASGI middleware: the request's URL and headers bounded (limits.check_head: 414, 431), an API route's
    query checked (422 naming a parameter it does not read: POST routes read none), the body read and
    checked here first (body.py: 413 past max_body_bytes, before it is read where Content-Length says so;
    413 past max_json_depth; 422 for text that is not Unicode), HEAD on a GET route answered as GET without
    its body (FastAPI's routes answer GET alone: HEAD /health was a 405), and each request's count and
    latency by route, a 500 too."""

    def __init__(self, app, server: Server) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]
        if scope["method"] == "HEAD" and scope["path"] in self.server.get_routes:
            scope, send = {**scope, "method": "GET"}, _no_body(send)
        share = Share(self.server.pending)  # its body's bytes, held until it is answered
        try:
            check_head(scope)  # a URL or headers longer than the server reads: 414 / 431 naming them
            if scope["path"] in self.server.queries:  # a query parameter no route reads is not ignored unsaid
                routes.check_query(scope.get("query_string", b""), self.server.queries[scope["path"]])
            headers = header_map(scope.get("headers") or [])
            receive = await checked_body(receive, headers, self.server.limits, share)
            await self.app(scope, receive, _watch_status(send, status))
        except RequestError as err:
            if err.param == "max_pending_bytes":
                self.server.metrics.inc("lmforge_rejected_total", limit=err.param)
            await _reply(send, err, status)
        finally:  # an error no handler answered passes on to Starlette's 500: counted as one
            share.release()
            route = scope["path"] if scope["path"] in self.server.routes else "other"  # bounded labels
            seconds = time.perf_counter() - start
            self.server.metrics.inc("lmforge_requests_total", route=route, status=str(status[0]))
            self.server.metrics.observe("lmforge_request_seconds", seconds, route=route)


def _no_body(send):
    """`send` that drops the body of the answer (a HEAD's: its headers, Content-Length included, stay)."""
    async def headers_only(message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return headers_only


def _watch_status(send, status: list):
    async def watched(message) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]
        await send(message)

    return watched


async def _reply(send, err: RequestError, status: list) -> None:
    response = error_response(err)
    status[0] = response.status_code

    async def no_body():
        return {"type": "http.disconnect"}

    await response({"type": "http"}, no_body, send)


def error_response(err: RequestError) -> JSONBody:
    """The JSON answer of a refused request."""
    return JSONBody(err.body(), status_code=err.status, headers=err.headers)


def _field(loc) -> str:
    """A validation error's field path ("inputs.0"): without where it was sent ("body", "query": a body's
    field may be named query) and the names pydantic gives the branches of a union ("str", "list[str]", a
    model's class name), which name no field of the request."""
    def branch(part) -> bool:
        return isinstance(part, str) and (part in ("str", "int", "float", "bool", "dict", "list")
                                          or "[" in part or part[:1].isupper())

    loc = tuple(loc)[1:] if tuple(loc)[:1] in (("body",), ("query",)) else tuple(loc)  # where it was sent
    return ".".join(str(p) for p in loc if not branch(p))


def _validation_error(request: Request, exc: RequestValidationError) -> JSONBody:
    errors = exc.errors()
    # of a union's branch errors, the one that reached deepest into the value (an index, then the fields of
    # an object there: documents.0.text) says where it is wrong
    indexed = [e for e in errors if any(isinstance(p, int) for p in e.get("loc", ()))]
    first = max(indexed, key=lambda e: len(e.get("loc", ()))) if indexed else errors[0]
    if first.get("type") == "json_invalid":  # its loc is ("body", character offset): no field to name
        why, at = (first.get("ctx") or {}).get("error", first.get("msg")), first.get("loc", (None, None))[-1]
        return error_response(RequestError(422, f"request body is not valid JSON: {why} (character {at})",
                                           param="body"))
    where = _field(first.get("loc", ()))
    if not where:  # the body itself: none, not an object, or not read as JSON (its content-type)
        return error_response(RequestError(422, _not_an_object(request, first), param="body"))
    return error_response(RequestError(422, f"{echoed(where)}: {first.get('msg')}", param=where))


def _not_an_object(request: Request, error: dict) -> str:
    """Why a body is no request: it is missing, its content-type is not JSON, or its JSON is no object."""
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if error.get("type") == "missing":
        return "the request has no body: send a JSON object"
    if "json" not in kind.lower():  # FastAPI reads no other body as JSON, nor one without a content-type
        return f"the body is sent {f'as content-type {kind!r}' if kind else 'without a content-type'}: " \
               "send content-type application/json"
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return f"the body must be a JSON object, not {names.get(type(error.get('input')), 'null')}"


def _http_error(request: Request, exc: StarletteHTTPException) -> JSONBody:
    """Starlette's own refusals (no such route, a method the route lacks) in the server's error shape; a body
    FastAPI's JSON parser refused other than as malformed (its 400) is the client's 422 naming the body."""
    if exc.status_code == 400 and isinstance(exc.__cause__, ValueError):
        return error_response(RequestError(422, f"request body {_unparsed(exc.__cause__)}", param="body"))
    known = {404: f"no route {request.url.path} (see /docs)",
             405: f"{request.method} is not allowed on {request.url.path}"}
    why = known.get(exc.status_code, str(exc.detail))
    headers = dict(getattr(exc, "headers", None) or {})
    if "GET" in headers.get("Allow", "").split(", ") and "HEAD" not in headers["Allow"]:  # Guard answers it
        headers["Allow"] += ", HEAD"
    return error_response(RequestError(exc.status_code, why, headers=headers))


def _unparsed(err: ValueError) -> str:
    """Why json.loads refused a body, in one line: Python reads no integer of more digits than
    sys.get_int_max_str_digits() (its time grows as their square; its advice is to the programmer)."""
    if "integer string conversion" in str(err):
        most = sys.get_int_max_str_digits()
        return f"holds an integer of more than {most} digits, longer than the server reads"
    return "is not valid JSON: " + (str(err).splitlines() or [type(err).__name__])[0]


def _cancelled(request: Request, exc: Cancelled) -> JSONBody:
    """A request whose client went away: one log line (an expected end, no traceback), a 499 nobody reads."""
    LOG.info("lmforge serve: %s %s was cancelled: its client went away", request.method, request.url.path)
    return error_response(RequestError(499, "the request was cancelled", kind="cancelled"))


def _server_error(request: Request, exc: Exception) -> JSONBody:
    return error_response(server_error(exc))


def create_app(models: dict, limits: Limits | None = None, threads: int | None = None,
               workers: int | None = None) -> FastAPI:
    """The server's FastAPI app over `models` (name -> ServedModel, see models.load_served); workers
    None: default_workers."""
    server = Server(models, limits, threads, workers)

    @asynccontextmanager
    async def lifespan(app):
        server.start()
        yield
        await asyncio.to_thread(server.stop)  # uvicorn has answered every request by now
        print(f"lmforge serve: drained; stopped after {server.metrics.total('lmforge_requests_total'):.0f} "
              "requests", file=sys.stderr, flush=True)

    app = FastAPI(title="lmforge serve", description=DESCRIPTION, version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, default_response_class=JSONBody)
    app.state.server = server
    app.add_exception_handler(RequestError, lambda request, err: error_response(err))
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Cancelled, _cancelled)  # not Exception's handler, which logs a traceback
    app.add_exception_handler(Exception, _server_error)
    for module in (routes, feature_routes, rerank_routes, streaming, page):
        app.include_router(module.router)
        server.routes.update(route.path for route in module.router.routes)
        server.get_routes.update(route.path for route in module.router.routes if "GET" in route.methods)
        if module is not page:  # a page's URL may carry a browser's or a link's own parameters
            server.queries.update((route.path, tuple(p.name for p in route.dependant.query_params))
                                  for route in module.router.routes)
    app.add_middleware(Guard, server=server)
    return app
