"""The application around the routes: HEAD on every GET route, 405's Allow, and the request metrics of an
error no handler answered."""
from __future__ import annotations

import pytest

from lmforge.serve import routes

GETS = ["/health", "/info", "/v1/models", "/metrics", "/", "/docs", "/attention?text=a+cat&model=enc"]


@pytest.mark.parametrize("path", GETS)
def test_head_on_a_get_route_is_its_get_without_the_body(local, path):
    """Was 405 (FastAPI's routes answer GET alone): a monitor's HEAD /health was refused."""
    got, head = local.get(path), local.head(path)
    assert got.status_code == head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    if path != "/metrics":  # its counters move between the two requests
        assert head.headers["content-length"] == got.headers["content-length"]


@pytest.mark.parametrize("method, path, allow", [("POST", "/health", "GET, HEAD"), ("HEAD", "/embed", "POST"),
                                                 ("DELETE", "/attention", "GET, HEAD")])
def test_a_method_the_route_lacks_is_405_allowing_what_it_answers(local, method, path, allow):
    answer = local.request(method, path)
    assert answer.status_code == 405 and answer.headers["allow"] == allow
    if method != "HEAD":
        assert answer.json()["error"]["message"] == f"{method} is not allowed on {path}"


def test_an_unexpected_error_is_a_one_line_500_and_counted(local, monkeypatch):
    """A 500 passed through the middleware uncounted: lmforge_requests_total never had a status 500."""
    def broken(*args, **kwargs):
        raise RuntimeError("first line\nsecond line")

    monkeypatch.setattr(routes, "bounded_ids", broken)
    metrics = local.app.state.server.metrics
    before = metrics.value("lmforge_requests_total", route="/tokenize", status="500")
    answer = local.post("/tokenize", json={"model": "enc", "text": "a cat"})
    assert answer.status_code == 500
    assert answer.json()["error"]["message"] == "internal error: RuntimeError: first line"
    assert metrics.value("lmforge_requests_total", route="/tokenize", status="500") == before + 1


def test_bodies_held_past_max_pending_bytes_are_429_and_each_is_given_back(local, monkeypatch):
    pending = local.app.state.server.pending
    assert pending.held == 0  # every answered request gave its bytes back
    monkeypatch.setattr(pending, "held", pending.limit - 10)  # other requests' bodies fill the room
    answer = local.post("/tokenize", json={"model": "enc", "text": "a cat"})
    assert answer.status_code == 429 and answer.headers["retry-after"] == "1"
    assert answer.json()["error"]["param"] == "max_pending_bytes"
    assert pending.held == pending.limit - 10


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/embed?normalize=false", {"model": "enc", "texts": ["a cat"]}),
    ("POST", "/v1/completions?max_tokens=1", {"model": "gen", "prompt": "a cat", "max_tokens": 2}),
    ("GET", "/health?verbose=1", None), ("GET", "/info?model=enc", None)])
def test_a_query_parameter_an_api_route_does_not_read_is_422_naming_it(local, method, path, body):
    """Was ignored unsaid: POST /embed?normalize=false answered normalized vectors."""
    answer = local.request(method, path, json=body)
    assert answer.status_code == 422, answer.text[:200]
    error = answer.json()["error"]
    assert error["param"] == path.split("?")[1].split("=")[0]
    assert "unknown query parameter" in error["message"]


def test_a_page_s_url_may_carry_a_query(local):
    assert local.get("/?utm_source=x").status_code == 200
