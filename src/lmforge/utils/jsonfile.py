"""The lenient reading of a JSON file that only informs a choice (is a model there, what does it name):
what it holds where that is a JSON object, None for anything else, so the reader that needs the file says
why it cannot read it."""
from __future__ import annotations

from pathlib import Path

from lmforge.utils.jsontext import loads


def json_object(path) -> dict | None:
    """The JSON object in the file `path`; None where there is none: no file, not readable, not UTF-8 or
    JSON (a ValueError each, nesting too deep included: jsontext.loads), or JSON that is not an object."""
    try:
        found = loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
