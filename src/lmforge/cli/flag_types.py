"""The argparse `type`s of lmforge's number flags: integers read as the options objects read them, bounds
said and checked, and numbers that keep the text typed for the error that quotes them."""
from __future__ import annotations

import argparse

from lmforge.config import options


def integer(text: str) -> int:
    """An argparse `type`: an integer's text as the options objects read it ("3.0", "1e3" too)."""
    return options.int_text(text)


def bounded(kind: type, low, high):
    """An argparse `type`: a `kind` (int or float; an int's text as coerce reads it, "3.0" too) in [low,
    high]; else argparse's one-line error naming the flag and the bounds (-1 is no count, NaN no size)."""
    def parse(text: str):
        try:
            value = options.int_text(text) if kind is int else kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'} in "
                                             f"[{low}, {high}], got {text!r}") from None
        if not low <= value <= high:  # NaN fails this too
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {text}")
        return value
    parse.bounds = (low, high)  # said in the flag's help (cli.build_parser: with_bounds)
    return parse


class TypedInt(int):
    """An int flag's value that keeps the text typed (.text): its error quotes 1e7, not 10000000."""


class TypedFloat(float):
    """A float flag's value that keeps the text typed (.text): its error quotes 1e400, not inf."""


def as_typed(read):
    """An argparse `type`: `read`'s number keeping its text (TypedInt, TypedFloat) for flag_error."""
    def parse(text: str):
        kept = (TypedInt if isinstance(value := read(text), int) else TypedFloat)(value)
        kept.text = text  # an options object stores Python's number (plain_number)
        return kept
    vars(parse).update({k: v for k, v in vars(read).items() if k == "bounds"})  # `bounded`'s, said in help
    parse.__name__ = {"integer": "int"}.get(read.__name__, read.__name__)  # argparse's "invalid float value"
    return parse
