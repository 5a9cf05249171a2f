"""The typed error of a request lmforge refuses, at the lowest layer so that every package raises one type:
config's option checks, utils' refusals of an unsafe output path, and everything between."""
from __future__ import annotations


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

