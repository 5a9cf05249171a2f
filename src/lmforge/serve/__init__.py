"""The HTTP inference server (`lmforge serve`): FastAPI routes over worker threads that own the
models and batch their work (see app.py for the request path, worker.py for the batching).

FastAPI is imported on first use of the app, so that `lmforge --help` does not pay for it."""
from __future__ import annotations

import importlib

from lmforge.serve.limits import Limits

_LAZY = {"Server": "app", "create_app": "app", "ServedModel": "models", "load_served": "models",
         "parse_model_specs": "models"}
__all__ = ["Limits", "ServedModel", "Server", "create_app", "load_served", "parse_model_specs"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"lmforge.serve.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'lmforge.serve' has no attribute {name!r}")
