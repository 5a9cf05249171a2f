"""What the server accepts, and the errors that push back when a request or the load exceeds it.

Every refusal names the limit it hit: 413 for a request that is too large (payload bytes, JSON nesting,
texts, tokens of a text and of the request, layers of a view, fill-mask candidates, and a generation's
new tokens, beams, sequences, top_k and stop strings), checked before the work it sizes is done; 429
with Retry-After when the queue is full, so a client can tell "send less" from "send later" and never
waits on a timeout.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from lmforge.config.options import check_options, option
from lmforge.generate.stops import MAX_STOP, MAX_STOP_CHARS
from lmforge.utils.errors import elided


@dataclass
class Limits:
    """The server's limits, bounded both ways; each one is named in the error of a request that exceeds it."""

    max_body_bytes: int = option(4 << 20, "bytes of one request body (413 beyond)", low=1, high=1 << 30)
    # slow clients each hold their body's bytes while it arrives: 150 of them held 350 MB
    max_pending_bytes: int = option(256 << 20, "bytes of the request bodies held at once, all requests "
                                    "together, from their first byte to their answer (429 with Retry-After "
                                    "beyond; a body is refused only while others are held)", low=1,
                                    high=1 << 40)
    max_inputs: int = option(2048, "texts or records of one request (413 beyond)", low=1, high=10**6)
    max_request_tokens: int = option(262144, "tokens of one request, all its texts together; a generation's: "
                                     "its prompts' and each one's new tokens, times its beams; a QA "
                                     "record's: what its overlapping windows hold (413 beyond)",
                                     low=1, high=1 << 27)
    max_batch_tokens: int = option(8192, "tokens of one forward pass: the batching budget (larger requests "
                                         "split)", low=1, high=1 << 24)
    max_batch_items: int = option(256, "texts of one forward pass", low=1, high=65536)
    max_queue: int = option(512, "requests admitted and not yet answered (429 with Retry-After beyond)",
                            low=1, high=10**6)
    max_new_tokens: int = option(1024, "new tokens one generation may ask for (413 beyond)",
                                 low=1, high=65536)
    max_top_k: int = option(100, "fill-mask candidates (413 beyond)", low=1, high=100_000)
    max_stop: int = option(MAX_STOP, "stop strings of one generation (413 beyond)", low=1, high=1024)
    # each stop string is sought at every step; the defaults are lmforge generate --stop's bounds
    max_stop_chars: int = option(MAX_STOP_CHARS, "characters of one stop string (413 beyond)",
                                 low=1, high=65536)
    max_input_tokens: int = option(65536, "tokens of one text tokenized whole: /tokenize's text, a prompt "
                                          "(413 beyond)", low=1, high=1 << 24)
    max_layers: int = option(64, "layers of one attention view or /features answer (413 beyond)",
                             low=1, high=1024)
    max_feature_values: int = option(2_000_000, "numbers in one /features answer: texts x layers x tokens x "
                                     "width (413 beyond)", low=1, high=1 << 30)
    max_documents: int = option(1024, "documents one /rerank request scores (413 beyond)", low=1, high=10**6)
    max_json_depth: int = option(32, "nesting of a request's JSON (413 beyond; records need 3)",
                                 low=3, high=1024)
    # each beam holds its own cache
    max_num_beams: int = option(16, "beams of one generation (413 beyond)", low=1, high=1024)
    max_return_sequences: int = option(16, "texts one generation request may ask for (413 beyond)",
                                       low=1, high=1024)
    max_sampling_top_k: int = option(1000, "a generation's top_k (413 beyond)", low=1, high=1 << 22)
    batch_wait_ms: float = option(0.0, "how long a worker waits for a batch to fill (0: take what is queued)",
                                  low=0, high=60_000)

    def __post_init__(self) -> None:
        check_options(self)

    def as_dict(self) -> dict:
        """The limits as plain JSON (for /info)."""
        return asdict(self)


MAX_TOKEN_CHARS = 128  # no vocabulary's token spans more characters (WordPiece: 100 make one [UNK])
HEAD_CHARS = 8  # characters a token per max_input_tokens read first (English runs ~4.5 a token)
_CUT_WORD = re.compile(r"\s\S*$")  # the whitespace before the last word of a head


def text_head(text: str, room: int) -> str:
    """`text`'s first `room` characters, less a word the cut splits (where it began within MAX_TOKEN_CHARS)
    and the whitespace before it: every word in the head is whole, so its tokens are the text's first ones
    and never more (WordPiece reads a 150-character word as one [UNK], its first 60 characters as 60 pieces:
    a head's count past the bound refused a text the model reads whole)."""
    if len(text) <= room:
        return text
    head, start = text[:room], max(room - MAX_TOKEN_CHARS, 0)
    if not text[room].isspace() and (cut := _CUT_WORD.search(head, start)):
        head = head[:cut.start()]
    return head.rstrip()


async def read_heads(count, texts: list, tokens: int, taken: int = 0, size=int) -> tuple:
    """(heads, counts): each text as far as `tokens` tokens read it and `await count(heads)`'s count of it.

    A text longer than tokens x MAX_TOKEN_CHARS characters is read to its text_head of that many (no token
    spans more: the rest is never read), unless the head holds no more than `tokens` tokens (mostly
    whitespace, long words): then the whole text decides, all such texts counted in one call of `count`.
    `taken`: tokens of each count besides the text's (a pair's query); `size`: a count's tokens (len of
    a tokenizer's offsets). `count` keeps tokenising off the event loop (a thread, the front tokenizer)."""
    room = tokens * MAX_TOKEN_CHARS
    heads = [text_head(t, room) for t in texts]
    counts = list(await count(heads))
    whole = [i for i, t in enumerate(texts) if len(t) > room and size(counts[i]) - taken <= tokens]
    if whole:
        for i, n in zip(whole, await count([texts[i] for i in whole])):
            heads[i], counts[i] = texts[i], n
    return heads, counts


MAX_MESSAGE, MAX_PARAM = 1000, 200  # characters of an error's message and param (longer: cut in the middle)
ECHO = 40  # characters of a client's value (a number, a name, a key) that a refusal repeats, about

# A request's head, refused by the app in its JSON shape: 414 past MAX_URL_BYTES (GET /attention's text
# rides in the query: 32 KiB holds thousands of tokens, percent-encoded), 431 past MAX_HEADER_BYTES (a
# browser's cookies for localhost are shared by every local app). h11 buffers an incomplete head up to
# HEAD_BYTES and answers past it with a plain-text 400 the app never sees; it is set (cli.serve) above
# both bounds together, so a head over either reaches the app and gets its JSON refusal. Its own default,
# 16 KiB, bound only a head that arrived in pieces: 100 kB sent at once on loopback was read whole.
MAX_URL_BYTES, MAX_HEADER_BYTES = 32 << 10, 32 << 10
HEAD_BYTES = 96 << 10  # h11_max_incomplete_event_size: each connection's buffer of a head not yet whole


def check_head(scope: dict) -> None:
    """414 naming url for a path and query of more than MAX_URL_BYTES bytes; 431 naming headers for headers
    of more than MAX_HEADER_BYTES, each counted as sent ("name: value" and its line end)."""
    query = scope.get("query_string") or b""
    url = len(scope.get("raw_path") or scope["path"].encode()) + (len(query) + 1 if query else 0)
    if url > MAX_URL_BYTES:
        raise RequestError(414, f"the URL (path and query) is {url} bytes, more than the server reads "
                           f"({MAX_URL_BYTES}); send a long text in a POST route's body", param="url",
                           kind="limit_exceeded")
    headers = sum(len(name) + len(value) + 4 for name, value in scope.get("headers") or ())
    if headers > MAX_HEADER_BYTES:
        raise RequestError(431, f"the headers are {headers} bytes, more than the server reads "
                           f"({MAX_HEADER_BYTES})", param="headers", kind="limit_exceeded")


def echoed(value, most: int = ECHO) -> str:
    """`value` as a refusal repeats it: its text, its middle left out past about `most` characters (elided),
    so the refusal stays one short line (a 4,000-digit top_k came back whole: a 1,036-character 413)."""
    return elided(str(value), most)


class RequestError(Exception):
    """A refused request: HTTP status, a one-line message, the offending parameter or limit (both bounded:
    a value of the client's echoed in them is elided)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None) -> None:
        message, param = elided(message, MAX_MESSAGE), elided(param, MAX_PARAM)
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers or {}

    def body(self) -> dict:
        """The OpenAI-style error body: {"error": {message, type, param, code}}."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.status}}


def server_error(err: Exception) -> RequestError:
    """The 500 of an error the server did not expect, in one line (a torch error's first)."""
    first = (str(err).splitlines() or [""])[0]
    said = f"{type(err).__name__}: {first}" if first else type(err).__name__
    return RequestError(500, f"internal error: {said}", kind="server_error")


def too_large(limit: str, message: str) -> RequestError:
    """413 naming `limit`."""
    return RequestError(413, f"{message} (limit {limit})", param=limit, kind="limit_exceeded")


def check_count(n: int, limits: Limits, field: str = "input", limit: str = "max_inputs") -> None:
    """Refuse a request's list `field` of more items than the limit named `limit` (413), or of none (422)."""
    most = getattr(limits, limit)
    if n > most:
        raise too_large(limit, f"{field}: {n} items, more than {limit}={most}")
    if n == 0:
        raise RequestError(422, f"{field} is empty: send at least one", param=field)


def check_text(field: str, text: str, limits: Limits) -> None:
    """Refuse, before tokenizing it, a text too long to hold max_input_tokens tokens or fewer."""
    if len(text) > limits.max_input_tokens * MAX_TOKEN_CHARS:
        raise too_large("max_input_tokens", f"{field} has {len(text)} characters, more than "
                        f"max_input_tokens={limits.max_input_tokens} tokens can hold")


def check_tokens(field: str, n: int, limits: Limits, head: int | None = None) -> None:
    """Refuse a text of more than max_input_tokens tokens (`head`: n counts its first `head` characters)."""
    if n > limits.max_input_tokens:
        held = f"holds {n} tokens in its first {head} characters" if head else f"is {n} tokens"
        raise too_large("max_input_tokens", f"{field} {held}, more than "
                        f"max_input_tokens={limits.max_input_tokens}")


def bounded_ids(field: str, encode, text: str, limits: Limits) -> list:
    """`encode(text)`'s ids, 413 past max_input_tokens; a long text is refused from its head alone when the
    head already holds too many tokens. The head is text_head's, ending at a whole word, so its tokens are
    the text's first ones (pre-tokenizers split locally): a word cut mid-way added up to ~100 WordPiece
    pieces, not the one token of slack once allowed. Run it off the event loop."""
    check_text(field, text, limits)
    if len(text) > limits.max_input_tokens * HEAD_CHARS:
        head = text_head(text, limits.max_input_tokens * HEAD_CHARS)
        check_tokens(field, len(encode(head)), limits, len(head))
    ids = encode(text)
    check_tokens(field, len(ids), limits)
    return ids


def check_generation(body, max_new_tokens: int, limits: Limits, new_tokens: str = "max_new_tokens") -> None:
    """Refuse, before any work, a generation request whose costs exceed the limits (413 naming the limit)."""
    asked = {"max_new_tokens": (new_tokens, max_new_tokens),
             "max_num_beams": ("num_beams", getattr(body, "num_beams", 1) or 1),
             "max_return_sequences": ("num_return_sequences", getattr(body, "num_return_sequences", 1) or 1),
             "max_sampling_top_k": ("top_k", getattr(body, "top_k", 0) or 0)}
    for limit, (name, value) in asked.items():
        most = getattr(limits, limit)
        if value > most:
            raise too_large(limit, f"{name}={echoed(value)} asks for more than {limit}={most}")


@dataclass(frozen=True)
class TextBound:
    """The tokens one text may have, and how a refusal names them: `param` the limit (or the request's own
    field) at fault, `said` its words as /info (or the request) spells them, `cut` whether the route takes
    truncate (only there may a refusal tell the client to send it), `field` the text ("input {}": by
    index)."""

    tokens: int
    said: str = ""  # "": the model's, max_tokens in /info
    param: str = "max_seq_len"
    cut: bool = True
    field: str = "input {}"

    def refuse(self, index: int, size: str) -> RequestError:
        """413: text `index`, of `size` ("600 tokens"), is more than the bound."""
        said = self.said or f"the model takes, max_tokens={self.tokens} in /info"
        advice = "; send truncate: true to cut it" if self.cut else ""
        return too_large(self.param, f"{self.field.format(index)} is {size}, more than {said}{advice}")


def text_bound(limit) -> TextBound:
    """`limit` as a TextBound: an int is the model's max_tokens (/info's), on a route that takes truncate."""
    return limit if isinstance(limit, TextBound) else TextBound(limit)


def check_request_tokens(total: int, limits: Limits, detail: str = "") -> None:
    """413 naming max_request_tokens for a request of more tokens than it, all its texts together (`detail`:
    how they add up)."""
    if total > limits.max_request_tokens:
        raise too_large("max_request_tokens", f"the request holds {total} tokens{detail}, more than "
                        f"max_request_tokens={limits.max_request_tokens}")


def fit_lengths(lengths: list, limit, truncate: bool, limits: Limits) -> list:
    """Each text's token count after truncation to `limit` (tokens, or a TextBound that names them); a text
    over it is a 413 unless `truncate`, and so is a request whose total exceeds max_request_tokens."""
    bound = text_bound(limit)
    out = []
    for i, n in enumerate(lengths):
        if n > bound.tokens and not truncate:
            raise bound.refuse(i, f"{n} tokens")
        out.append(min(n, bound.tokens))
    check_request_tokens(sum(out), limits)
    return out


class Admission:
    """The bounded queue's front door: requests admitted and not yet answered, and their tokens.

    Used from the event loop only (admit before a job is queued, release when it is answered),
    so it needs no lock. Retry-After estimates when the backlog will have drained from the
    workers' measured throughput."""

    def __init__(self, limits: Limits) -> None:
        self.limits, self.pending, self.tokens = limits, 0, 0
        self.tokens_per_second = 0.0  # written by the workers: an exponential average
        self.closing = False

    def admit(self, tokens: int) -> None:
        """Count a request in; 429 when max_queue requests are pending, 503 once draining."""
        if self.closing:
            raise RequestError(503, "the server is shutting down", kind="unavailable",
                               headers={"Retry-After": "1"})
        if self.pending >= self.limits.max_queue:
            raise RequestError(429, f"the queue is full: {self.pending} requests pending "
                               f"(limit max_queue={self.limits.max_queue}); retry later", param="max_queue",
                               kind="rate_limit_exceeded", headers={"Retry-After": str(self.retry_after())})
        self.pending += 1
        self.tokens += tokens

    def release(self, tokens: int) -> None:
        """Count an answered (or abandoned) request out."""
        self.pending -= 1
        self.tokens -= tokens

    def retry_after(self) -> int:
        """Whole seconds until the queued tokens will have been served (at least 1)."""
        rate = self.tokens_per_second
        return max(1, math.ceil(self.tokens / rate)) if rate > 0 else 1
