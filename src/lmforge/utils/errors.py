"""The typed error of a request lmforge refuses, at the lowest layer so that every package raises one type:
config's option checks, utils' refusals of an unsafe output path, and everything between."""
from __future__ import annotations


SHOWN = 40  # characters of a refused value a message repeats (about: the marker of a cut adds some)


def elided(text: str | None, most: int) -> str | None:
    """`text` of at most about `most` characters: its head and tail, the middle left out and counted (a
    client's 1 MB model name came back whole in the 404 that echoed it; the tail says the limit or field);
    left whole where the cut, with its marker, would be no shorter (it hid a few characters, and grew)."""
    if text is None or len(text) <= most:
        return text
    cut = f"{text[:most // 2]} ... ({len(text) - most} characters left out) ... {text[-most // 2:]}"
    return cut if len(cut) < len(text) else text


def shown(value, most: int = SHOWN) -> str:
    """repr(value) as a refusal repeats it, elided past about `most` characters: one short line whatever
    a caller gave (every refusal cuts a value this one way)."""
    return elided(repr(value), most)


class OptionsError(ValueError):
    """An option (or config field) that cannot be served; the message names it, `.field` holds it."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def instance_of(value, cls: type, name: str, optional: bool = True):
    """`value` where it is a `cls` (or None, where `optional`: the caller's defaults), else an OptionsError
    naming the argument `name` ("task_cfg must be a TaskConfig, got dict"): a job's options object checked
    once, on entry, never met as a TypeError or an AttributeError deep in the run."""
    if isinstance(value, cls) or (optional and value is None):
        return value
    raise OptionsError(f"{name} must be a {cls.__name__}, got {type(value).__name__}", name)


def checked_text(text, name: str | None, shown: str | None = None, kind: str = "a text") -> str:
    """`text` where it is a str that is valid Unicode, else an OptionsError naming `name` (said as `shown`;
    name None: a record's field, which tasks.fields.naming fills): text=5 met a TypeError deep in."""
    shown = shown or name
    if not isinstance(text, str):
        raise OptionsError(f"{shown} must be {kind}, got {type(text).__name__}", name)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise OptionsError(f"{shown} is not valid Unicode: {err.reason} at position {err.start}",
                           name) from None
    return text

