"""The application around the routes: the answer and the request metrics of an error no handler answered."""
from __future__ import annotations

from lmforge.serve import routes


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
