"""A request's head is bounded by the app, in its JSON error shape: a URL over MAX_URL_BYTES is a 414 naming
url, headers over MAX_HEADER_BYTES a 431 naming headers, however the head arrives (at once, or in pieces:
h11's default 16 KiB limit answered a head in pieces with a plain-text 400, while 100 kB sent at once
was read whole); a head past HEAD_BYTES, h11's buffer, is still a 4xx and never a traceback."""
from __future__ import annotations

import json
import socket
import time

import pytest

from lmforge.serve.limits import HEAD_BYTES, MAX_HEADER_BYTES, MAX_URL_BYTES, RequestError, check_head

PIECE = 4096  # bytes of each write when a head is sent in pieces


def _send(url: str, head: bytes, pieces: bool) -> tuple:
    """The status, headers and body of the answer to `head` sent on a new connection to `url` at once or
    in PIECE-byte writes (each one its own read on the server: h11 sees an incomplete head)."""
    host, port = url.split("//")[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for start in range(0, len(head), PIECE if pieces else len(head)):
                sock.sendall(head[start:start + (PIECE if pieces else len(head))])
                if pieces:
                    time.sleep(0.002)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the whole head was sent: its answer is read below
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    top, _, body = answer.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), fields, body


def _head(target: str, extra: str = "") -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}Connection: close\r\n\r\n".encode()


def _error(answer: tuple, status: int, param: str) -> str:
    code, fields, body = answer
    assert code == status, body[:300]
    assert fields["content-type"] == "application/json", fields
    error = json.loads(body)["error"]
    assert error["param"] == param and error["code"] == status and "\n" not in error["message"], error
    return error["message"]


@pytest.mark.parametrize("pieces", [False, True], ids=["at-once", "in-pieces"])
@pytest.mark.parametrize("target", ["/health?x=", "/attention?model=enc&text=", "/no-such-route/"])
def test_a_url_over_the_bound_is_414_naming_url(server, target, pieces):
    long = target + "a" * MAX_URL_BYTES
    message = _error(_send(server.url, _head(long), pieces), 414, "url")
    assert f"{len(long)} bytes" in message and str(MAX_URL_BYTES) in message


@pytest.mark.parametrize("pieces", [False, True], ids=["at-once", "in-pieces"])
@pytest.mark.parametrize("extra", ["X-Long: " + "v" * MAX_HEADER_BYTES + "\r\n",
                                   "".join(f"X-{i}: v\r\n" for i in range(MAX_HEADER_BYTES // 8))],
                         ids=["one-long", "very-many"])
def test_headers_over_the_bound_are_431_naming_headers(server, extra, pieces):
    message = _error(_send(server.url, _head("/health", extra), pieces), 431, "headers")
    assert str(MAX_HEADER_BYTES) in message


def test_a_long_query_within_the_bound_reaches_the_route(server):
    """A 30 kB text in /attention's query is read whole: the route's own 413 names its token bound."""
    text = "word+" * 6000
    assert len(text) < MAX_URL_BYTES - 100
    _error(_send(server.url, _head(f"/attention?model=enc&text={text}"), True), 413, "max_seq_len")
    code, _, body = _send(server.url, _head("/health", "X-Some: " + "v" * 8000 + "\r\n"), True)
    assert code == 200, body  # headers within their bound pass


def test_a_head_past_h11_s_buffer_is_a_4xx_without_a_traceback(server):
    assert HEAD_BYTES > MAX_URL_BYTES + MAX_HEADER_BYTES + 1024  # the app's bounds are met first
    code, _, body = _send(server.url, _head("/health?x=" + "a" * (2 * HEAD_BYTES)), True)
    assert 400 <= code < 500 and b"Traceback" not in body, body
    assert "Traceback" not in server.log.read_text()
    code, _, _ = _send(server.url, _head("/health"), False)
    assert code == 200  # the server goes on


def test_check_head_counts_the_url_and_headers_as_sent():
    at_bound = {"path": "/x", "raw_path": b"/x", "query_string": b"q" * (MAX_URL_BYTES - 3),
                "headers": [(b"a", b"v" * (MAX_HEADER_BYTES - 5))]}
    check_head(at_bound)  # "/x" "?" and the query; "a: " the value and CRLF: each exactly at its bound
    for over, status in ([{"query_string": at_bound["query_string"] + b"q"}, 414],
                         [{"headers": [(b"ab", b"v" * (MAX_HEADER_BYTES - 5))]}, 431]):
        with pytest.raises(RequestError) as err:
            check_head({**at_bound, **over})
        assert err.value.status == status
