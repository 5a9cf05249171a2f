"""A request body read within the limits and checked before any route parses it.

The body is counted as it arrives (a declared Content-Length over max_body_bytes is refused before a
byte is read, a body that sends more than it declared or a chunked one at the first chunk past the
limit), and so are the bodies of all requests together until each is answered (max_pending_bytes: a
429 to send later, so slow clients cannot hold the memory of one body each without bound), then two
things the JSON parser and the routes cannot refuse cleanly are checked: nesting
deeper than max_json_depth (a 4 MB `[[[[...` would otherwise reach the parser's recursion limit),
and text that is not Unicode (bytes that are not UTF-8, or an escaped lone surrogate such as
"\\ud800", which Python's JSON parser accepts and every tokenizer refuses): a 422 naming the field; so is
a key an object gives twice (the parser would keep the last value and drop the first unsaid).
A body sent in a Content-Encoding other than identity (gzip, ...) is refused first, 415: bodies are read
as sent, and a gzip one was answered as JSON that is not UTF-8.
"""
from __future__ import annotations

import json
import re

import anyio
import numpy as np

from lmforge.serve.limits import Limits, RequestError, echoed, too_large

INLINE_BYTES = 64 * 1024  # bodies checked on the event loop itself; larger ones on a helper thread
# a JSON string, escapes included; an unterminated one runs to the end (so each byte is scanned once)
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)', re.S)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class Pending:
    """The bytes of request bodies held now, all requests together (the event loop's alone: no lock)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0


class Share:
    """One request's part of the Pending bytes: taken as its body is declared or arrives, given back
    (release) once it is answered."""

    def __init__(self, pending: Pending) -> None:
        self.pending, self.bytes = pending, 0

    def take(self, n: int) -> None:
        """Hold `n` more bytes; 429 naming max_pending_bytes where other requests' bodies hold the room."""
        pending = self.pending
        if pending.held > self.bytes and pending.held + n > pending.limit:
            raise RequestError(429, f"request bodies of {pending.held} bytes are held (limit "
                               f"max_pending_bytes={pending.limit}); retry later", param="max_pending_bytes",
                               kind="rate_limit_exceeded", headers={"Retry-After": "1"})
        pending.held += n
        self.bytes += n

    def release(self) -> None:
        """Give back every byte this request holds."""
        self.pending.held -= self.bytes
        self.bytes = 0


async def read_body(receive, headers: dict, limit: int, share: Share | None = None) -> list:
    """The request's messages up to its end (or the client's disconnect); 413 naming max_body_bytes
    as soon as the declared or the received size exceeds `limit`; its bytes held in `share` (the declared
    ones at once), 429 where the other requests' hold the room."""
    declared = headers.get(b"content-length")
    take = share.take if share is not None else lambda n: None
    taken = 0
    if declared is not None:
        size = int(declared) if declared.strip().isdigit() else 0  # a bad value: the server refuses it
        if size > limit:
            raise too_large("max_body_bytes", f"the body is {size} bytes, more than max_body_bytes={limit}")
        take(size)
        taken = size
    messages, received = [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages
        received += len(message.get("body", b""))
        if received > limit:
            raise too_large("max_body_bytes", f"the body is more than max_body_bytes={limit} bytes")
        if received > taken:  # beyond what it declared (or declared nothing): held as it comes
            take(received - taken)
            taken = received
        if not message.get("more_body", False):
            return messages


def too_deep(body: bytes, depth: int) -> bool:
    """Whether the JSON `body` nests arrays and objects deeper than `depth` (strings skipped): the highest
    running count of openers less closers, in one pass over the bytes."""
    brackets = np.frombuffer(_NOT_BRACKET.sub(b"", _STRING.sub(b"", body)), dtype=np.uint8)
    if brackets.size <= depth:
        return False
    steps = np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1).astype(np.int32)
    return int(np.cumsum(steps).max()) > depth


def not_unicode(body: bytes) -> str | None:
    """The field (a path like texts.1 or inputs.0.text) of the first string of the JSON `body` that is
    not Unicode; None when every string is (or the body is no JSON: the route's parser says so)."""
    try:
        body.decode("utf-8")
        if not _SURROGATE_ESCAPE.search(body):
            return None
    except UnicodeDecodeError:
        pass
    try:  # the bytes that are not UTF-8 become lone surrogates, as the escaped ones are
        value = json.loads(body.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        return None
    return _first_bad(value, ())


def _first_bad(value, path: tuple) -> str | None:
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    if isinstance(value, str):
        return (".".join(map(str, path)) or "body") if _SURROGATE.search(value) else None
    for key, item in items:
        if isinstance(key, str) and _SURROGATE.search(key):
            return ".".join(map(str, path + (key.encode("utf-8", "replace").decode(),)))
        found = _first_bad(item, path + (key,))
        if found is not None:
            return found
    return None


_TWICE = object()  # the value of a key an object gives more than once


def given_twice(body: bytes) -> str | None:
    """The field (a path like documents.1.text) of the first key that an object of the JSON `body` gives
    twice, whose first value json.loads would drop unsaid; None when none is (or the body is no JSON)."""
    repeated = []

    def pairs(items: list) -> dict:
        seen = dict(items)
        if len(seen) < len(items):  # a key given twice: marked, for the path to it to be found
            repeated.append(True)
            seen = {}
            for key, value in items:
                seen[key] = _TWICE if key in seen else value
        return seen

    try:
        value = json.loads(body.decode("utf-8", "surrogateescape"), object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    return _first_twice(value, ()) if repeated else None  # the walk only where the parse saw one


def _first_twice(value, path: tuple) -> str | None:
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if item is _TWICE:
            return ".".join(map(str, path + (key,)))
        found = _first_twice(item, path + (key,))
        if found is not None:
            return found
    return None


def check_json(body: bytes, limits: Limits) -> None:
    """413 for nesting past max_json_depth, 422 naming the field of text that is not Unicode or of a key
    given twice."""
    if too_deep(body, limits.max_json_depth):
        raise too_large("max_json_depth",
                        f"the JSON nests deeper than max_json_depth={limits.max_json_depth}")
    field = not_unicode(body)
    if field is not None:
        raise RequestError(422, f"{echoed(field)}: not valid Unicode (bytes that are not UTF-8, or a lone "
                           "surrogate such as \\ud800)", param=field)
    field = given_twice(body)
    if field is not None:
        raise RequestError(422, f"{echoed(field)}: given twice in the body (JSON would keep the last one "
                           "unsaid); send it once", param=field)


def header_map(pairs) -> dict:
    """An ASGI scope's (name, value) header pairs as {name: value}, a name sent more than once with its
    values joined by ", " as HTTP combines them (RFC 9110 5.3): dict(pairs) kept only the last, so a
    second Content-Encoding of identity hid a first of gzip."""
    out: dict = {}
    for name, value in pairs:
        out[name] = out[name] + b", " + value if name in out else value
    return out


def check_encoding(headers: dict) -> None:
    """415 naming content-encoding where the request says its body is coded other than identity (a list
    "gzip, identity" included): the body would be read as sent, its compressed bytes as JSON."""
    given = headers.get(b"content-encoding", b"").decode("latin-1").strip()
    if any(coding.strip().lower() not in ("", "identity") for coding in given.split(",")):
        raise RequestError(415, f"content-encoding {given!r}: bodies are read uncompressed; send the JSON "
                           "as it is, without a content-encoding (or identity)", param="content-encoding",
                           headers={"Accept-Encoding": "identity"})  # RFC 7694: the codings it reads


async def checked_body(receive, headers: dict, limits: Limits, share: Share | None = None):
    """A `receive` that replays the body read and checked here, then passes on to the client's
    (whose next message is its disconnect); its bytes held in `share` (read_body). A coded body is
    refused before a byte of it is read (check_encoding)."""
    check_encoding(headers)
    messages = await read_body(receive, headers, limits.max_body_bytes, share)
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
    if body:
        if len(body) <= INLINE_BYTES:
            check_json(body, limits)
        else:
            await anyio.to_thread.run_sync(check_json, body, limits)
    replay = [{"type": "http.request", "body": body, "more_body": False}] \
        if messages[-1]["type"] == "http.request" else messages[-1:]

    async def replayed():
        return replay.pop(0) if replay else await receive()

    return replayed
