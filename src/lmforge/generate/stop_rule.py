"""Stop strings' one rule: a generated text ends before the first of them, alike in every face
(`lmforge generate --stop`, the server's `stop`, and Python: `lmforge.generate(..., stop_strings=)` and
generate/stops.py's `generate_until_stop`). It lives apart from stops.py, which calls lmforge.generate, so
that lmforge.generate can seek stop strings by it too (generate/stop_rows.py) without an import cycle.

They are checked once, by `check_stops`: none empty (it would be found before the first token), at most
MAX_STOP of them and none longer than MAX_STOP_CHARS characters (each is sought at every step). These are
the server's default limits (serve/limits.py's max_stop and max_stop_chars, which a server may set
otherwise) and the command line's and Python's.

The text of the new ids is joined at each step as the whole decoded text has it (decoding piece by piece
loses WordPiece joins and splits multi-byte characters), though only its last ids are decoded again
(generate/text.py's Continuation: a step's cost stays flat), cut at the first stop string in it (sought
in the text the step may have changed), and the part that could still become a stop string or an
incomplete character is held back, so a streamed text never shows what the final text does not. Greedy
and sampled generation ends at the step a stop string appears; beam search, whose best hypothesis is known
only at the end, has its finished text cut.
"""
from __future__ import annotations

from lmforge.generate.text import Continuation
from lmforge.utils.errors import OptionsError

MAX_STOP = 8  # stop strings of one generation
MAX_STOP_CHARS = 256  # characters of one stop string
EMPTY = "a stop string is empty (the text would end before it began): leave it out"


class StopLimitError(OptionsError):
    """Stop strings past a bound: more of them, or a longer one, than the bound `.limit` (the server's
    setting of that name) allows; its message says the bound as a number, which reads alike on every face
    (the server adds the setting's name, the command line has no such setting)."""

    def __init__(self, message: str, limit: str, field: str = "stop") -> None:
        super().__init__(message, field)
        self.limit = limit


def check_stops(stop, max_stop: int = MAX_STOP, max_chars: int = MAX_STOP_CHARS,
                field: str = "stop") -> tuple:
    """`stop` (a string, a list of strings, or None) as a tuple of strings, each non-empty, at most `max_stop`
    of them and none over `max_chars` characters; else an OptionsError whose field names the string (`field`,
    `field`.i: the face's name for them; its message does not), a StopLimitError for a bound."""
    listed = not isinstance(stop, str)
    stops = list(stop or []) if listed else [stop]
    for i, text in enumerate(stops):
        named = f"{field}.{i}" if listed else field
        if not isinstance(text, str):
            raise OptionsError(f"a stop string must be a str, got {type(text).__name__}", named)
        if not text:
            raise OptionsError(EMPTY, named)
    if len(stops) > max_stop:
        raise StopLimitError(f"{len(stops)} stop strings, more than the {max_stop} allowed", "max_stop",
                             field)
    longest = max(map(len, stops), default=0)
    if longest > max_chars:
        raise StopLimitError(f"a stop string of {longest} characters, more than the {max_chars} allowed",
                             "max_stop_chars", field)
    return tuple(stops)


def held(text: str, stops: tuple) -> int:
    """Characters at the end of `text` that begin some stop string (they may yet complete it)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


class TextTail:
    """The text of the ids generated so far: what may be shown, and whether a stop string appeared."""

    def __init__(self, tokenizer, stops: tuple = (), context: list = ()) -> None:
        self.joined, self.stops = Continuation(tokenizer, context), tuple(s for s in stops if s)
        self.shown, self.text, self.stopped = "", "", False
        self.longest = max(map(len, self.stops), default=0)

    def seek(self, token: int) -> str:
        """Add one id, seeking the stop strings only (nothing is shown: lmforge.generate's rows); returns
        the text so far, cut before a stop string that appeared, joined to the `context` ids before it (a
        decoder's prompt) as generate/text.py joins it."""
        # a stop string wholly in the settled text was there, and sought, at an earlier step
        start = max(len(self.joined.settled) - self.longest + 1, 0)
        text = self.joined.push(token)
        cut = min((i for i in (text.find(s, start) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, text = True, text[:cut]
        self.text = text
        return text

    def push(self, token: int) -> str:
        """Add one id (seek); returns the text newly safe to show (maybe ""): the part that could still
        begin a stop string, or half a character, is held back."""
        text = self.seek(token)
        if not text.startswith(self.shown):  # a join changed earlier text: wait until it settles
            return ""
        safe = len(text) if self.stopped else len(text) - held(text, self.stops)
        if not self.stopped and text.endswith("\ufffd"):  # half a character
            safe = min(safe, len(text) - 1)
        delta = text[len(self.shown):max(safe, len(self.shown))]
        self.shown += delta
        return delta

    def feed(self, ids: list) -> list:
        """Add finished ids (beam search's); returns them up to the one whose text holds a stop string."""
        if not self.stops:  # nothing to seek: one decoding, not one per id
            self.joined.ids.extend(ids)
            self.text = self.joined.text()
            return list(ids)
        for at, token in enumerate(ids):
            self.seek(token)  # nothing is shown as they come: the text is read whole (.text)
            if self.stopped:  # the ids and their count end where the text does, as a greedy run's
                return list(ids[:at + 1])
        return list(ids)

    def rest(self) -> str:
        """The text not yet shown, once generation is over."""
        return self.text[len(self.shown):] if self.text.startswith(self.shown) else ""
