"""The typed error of a request lmforge refuses, at the lowest layer so that every package raises one type:
config's option checks, utils' refusals of an unsafe output path, and everything between."""
from __future__ import annotations


class OptionsError(ValueError):
    """An option (or config field) that cannot be served; the message names it, `.field` holds it."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
