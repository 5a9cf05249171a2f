"""Over-long lines, fed to a tokenizer trainer in pieces so that its memory stays bounded.

The `tokenizers` trainers take each line (each text of an iterator) as one sequence and hold
every word of it at once, at about 100 bytes a character: a 48 MB single-line file peaks near
4 GB. A line longer than MAX_PIECE characters is therefore cut into pieces of at most MAX_PIECE,
each cut just before a whitespace character. Every pre-tokenizer the trainers use here splits at
whitespace (a piece that starts with the space keeps byte-level BPE's "Ġword" and unigram's
"▁word"), so the words counted, hence the tokenizer trained, are those of the whole line; only a
stretch of MAX_PIECE characters without any whitespace is cut inside a word. What was cut is
reported in one warning per file, naming the first line cut; texts from memory (a pretraining
corpus's documents) are cut silently unless a cut falls inside a word, the one cut that changes
what is trained.
"""
from __future__ import annotations

import warnings
from pathlib import Path

MAX_PIECE = 1 << 16  # characters: a trainer then holds a few MB per sequence
BLOCK = 1 << 20  # bytes (or characters) read at once


def first_long_line(file: Path, limit: int | None = None) -> int | None:
    """The number (from 1) of the first line of `file` longer than `limit` bytes (default MAX_PIECE),
    or None; read in blocks, so a long line is never held whole."""
    limit = limit or MAX_PIECE
    run, line = 0, 1  # bytes of the current line so far, its number
    with open(file, "rb") as handle:
        while block := handle.read(BLOCK):
            parts = block.split(b"\n")
            lengths = [run + len(parts[0]), *map(len, parts[1:])]
            if max(lengths) > limit:
                return line + next(i for i, n in enumerate(lengths) if n > limit)
            line += len(parts) - 1
            run = lengths[-1]
    return None


def cut(text: str, limit: int) -> list:
    """`text` in pieces of at most `limit` characters, each cut just before a whitespace character
    (inside a word only where `limit` characters hold none)."""
    pieces, start = [], 0
    while len(text) - start > limit:
        window = text[start + 1:start + limit + 1]  # a cut before its last character still fits
        at = max(window.rfind(" "), window.rfind("\n"), window.rfind("\t"))
        end = start + 1 + at if at >= 0 else start + limit
        pieces.append(text[start:end])
        start = end
    pieces.append(text[start:])
    return pieces


class Cutter:
    """Cuts the long lines (or texts) of one source, and warns once about them (`warn`)."""

    def __init__(self, source: str, limit: int | None = None, noun: str = "line", quiet: bool = False):
        self.source, self.limit, self.noun, self.quiet = source, limit or MAX_PIECE, noun, quiet
        self.cuts, self.first, self.longest, self.in_words = 0, None, 0, 0

    def pieces(self, text: str, number: int, before: int = 0) -> list:
        """Text number `number` in pieces; `before`: characters of it already given out in pieces."""
        if before == 0 and len(text) <= self.limit:
            return [text]
        self.cuts, self.first = self.cuts + 1, self.first or number
        self.longest = max(self.longest, before + len(text))
        pieces = [piece for piece in cut(text, self.limit) if piece]
        self.in_words += sum(not piece[0].isspace() for piece in pieces[1:])
        return pieces

    def warn(self) -> None:
        """One warning (a CorpusWarning) naming the source and its first long line, if any was cut (if
        quiet: only if a cut fell inside a word)."""
        if not self.cuts or (self.quiet and not self.in_words):
            return
        from lmforge.data.corpus import CorpusWarning

        more = f" and {self.cuts - 1} more" if self.cuts > 1 else ""
        words = f" ({self.in_words} cut(s) inside a word: no whitespace that long)" if self.in_words else ""
        warnings.warn(f"{self.source}: {self.noun} {self.first}{more} longer than {self.limit:,} characters "
                      f"(up to {self.longest:,}): fed to the tokenizer trainer in pieces cut at whitespace, "
                      f"which bounds its memory{words}", CorpusWarning, stacklevel=2)


def text_pieces(texts, source: str, noun: str = "text", limit: int | None = None):
    """The texts, each long one as its pieces (see `cut`); then one warning if a cut fell inside a word."""
    cutter = Cutter(source, limit, noun, quiet=True)
    for number, text in enumerate(texts, 1):
        yield from cutter.pieces(text, number)
    cutter.warn()


def file_pieces(file: Path, limit: int | None = None):
    """The lines of a UTF-8 text file with their line ends (as `tokenizers` reads files), in blocks so
    that a long line is never held whole: its pieces (see `cut`) come as they are read; then one
    warning if any was cut."""
    from lmforge.tokenizer.wrapper import TokenizerError

    cutter = Cutter(str(file), limit)
    limit = cutter.limit
    carry, number, before = "", 1, 0  # before: characters of line `number` already given out
    try:
        with open(file, encoding="utf-8", newline="") as handle:  # line ends kept, as the Rust reader does
            while block := handle.read(BLOCK):
                *whole, carry = (carry + block).split("\n")
                for line in whole:
                    yield from cutter.pieces(line + "\n", number, before)
                    number, before = number + 1, 0
                if len(carry) > limit:  # a line still going: give out all but its tail
                    *ready, carry = cut(carry, limit)
                    before += sum(map(len, ready))
                    cutter.in_words += sum(not piece[0].isspace() for piece in [*ready[1:], carry])
                    yield from ready
    except UnicodeDecodeError as err:
        raise TokenizerError(f"{file} is not UTF-8 text: {err}") from None
    if carry or before:
        yield from cutter.pieces(carry, number, before)
    cutter.warn()
