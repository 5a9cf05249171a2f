"""JSON text a user gives (task files, corpora, passages, configs), parsed with one more guarantee than
`json.loads`: nesting too deep for Python's parser is a `json.JSONDecodeError` (a ValueError, which
every reader already turns into a one-line message naming the file and line), not a RecursionError."""
from __future__ import annotations

import json


def loads(text: str | bytes, strict: bool = True):
    """`json.loads(text, strict=strict)`; a RecursionError (`[[[[...` thousands deep) becomes a
    JSONDecodeError saying the JSON nests too deeply."""
    try:
        return json.loads(text, strict=strict)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text if isinstance(text, str) else "", 0) from None
