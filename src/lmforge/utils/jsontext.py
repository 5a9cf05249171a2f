"""JSON text a user gives (task files, corpora, passages, configs), parsed with one more guarantee than
`json.loads`: nesting too deep for Python's parser is a `json.JSONDecodeError` (a ValueError, which
every reader already turns into a one-line message naming the file and line), not a RecursionError."""
from __future__ import annotations

import json
import math


def loads(text: str | bytes, strict: bool = True, unique_keys: bool = False):
    """`json.loads(text, strict=strict)`; a RecursionError (`[[[[...` thousands deep) becomes a
    JSONDecodeError saying the JSON nests too deeply. unique_keys: an object naming a key twice is a
    JSONDecodeError naming it (json.loads keeps the last value, unsaid: a record's second "label" won)."""
    hook = _unique if unique_keys else None
    try:
        return json.loads(text, strict=strict, object_pairs_hook=hook)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text if isinstance(text, str) else "", 0) from None
    except _Repeated as err:
        raise json.JSONDecodeError(f"the key {err.args[0]!r} is given twice in one object",
                                   text if isinstance(text, str) else "", 0) from None


class _Repeated(Exception):
    """A key met twice in one JSON object (raised inside the parser's hook, said as a JSONDecodeError)."""


def _unique(pairs: list) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _Repeated(key)
        out[key] = value
    return out


def finite(data):
    """`data` (dicts, lists and tuples of JSON values) with every NaN or infinite float as None: JSON has
    no NaN, and a strict reader (a browser's JSON.parse, jq, Go, Rust) refuses the file Python's
    json.dumps writes with one."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(v) for v in data]
    return data


def dumps(data, **options) -> str:
    """json.dumps of `data` as strict JSON: non-finite floats written as null (finite), never NaN."""
    return json.dumps(finite(data), allow_nan=False, **options)
