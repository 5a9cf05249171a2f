"""The page at `/`: try each route from a browser (a form, the request body, the answer), and
see a model's attention on the text (the analysis view from GET /attention, shown in a frame).

The routes and the models come from /v1/models: a route is offered where some model has its
capability, and the model list holds the models that have it. /embed and /v1/embeddings show their
options (dimensions, encoding_format, truncate), /features its own (layers, pooling, the scalar mix,
truncate) and /rerank a query and documents (top_n, return_documents, truncate); each answer is
summarised above its JSON (a feature's shape, first numbers and tokens with their offsets; the
documents in their order with their scores and whether each was cut), and a refusal is shown with
the field or limit it names, the field marked in the form.

Self-contained: the script and style in assets/ are inlined, nothing loads from elsewhere, so it
works offline. A URL hash fills the form and sends the request when the page loads or the hash
changes, e.g. `/#route=features&text=Hello&layers=0,-1` (any option by its field name; a rerank's
documents are the text's lines); the answer lands in <pre id="result" data-state="done">, the
summary in <div id="summary" data-kind=...>, which is how the page is tested in a headless browser.
"""
from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from lmforge.serve.docs import DOCS_HTML

router = APIRouter(include_in_schema=False)


def _asset(name: str) -> str:
    """The text of one file of assets/."""
    return resources.files("lmforge.serve").joinpath("assets", name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def page_html() -> str:
    """The page: assets/page.html with its style and script inlined."""
    parts = {"css": _asset("page.css"), "js": _asset("page.js")}
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _asset("page.html"))


@router.get("/", response_class=HTMLResponse)
async def page() -> HTMLResponse:
    """The try-it page."""
    return HTMLResponse(page_html())


@router.get("/docs", response_class=HTMLResponse)
async def docs() -> HTMLResponse:
    """The API reference, rendered from /openapi.json by a self-contained script (works offline)."""
    return HTMLResponse(DOCS_HTML)


@router.get("/docs/swagger", response_class=HTMLResponse)
async def swagger() -> HTMLResponse:
    """FastAPI's Swagger UI: it loads its script from a CDN, so it needs internet access."""
    return get_swagger_ui_html(openapi_url="/openapi.json", title="lmforge serve: Swagger UI")
