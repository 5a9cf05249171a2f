"""Sentence segmentation: rules that know abbreviations, initials, decimals, ellipses and quotes.

A candidate boundary is a run of terminators (. ! ? …) with any closing quotes or
brackets right after it, then whitespace. It is a sentence end unless

- the next word starts with a lower-case letter ("e.g. the", "Wait... what?", '"Help!" she
  cried'),
- the word before a single period is a title or a never-final abbreviation (Mr. Dr. Prof.
  St. e.g. i.e. vs. cf. ...), an abbreviation that precedes a number (No. 5, Fig. 2, pp. 3)
  with a digit next, or a one-letter initial (J. R. R. Tolkien; not "I"),
- the sentence so far is only a list marker ("1.", "a.").

Chinese and Japanese full-width terminators (。！？) end a sentence with or without a space
after them (those scripts put none between sentences), except inside a quotation closed
right after them with no space (「行こう。」と言った).

Decimals (3.14) and initialisms inside a word (U.S.A.) never match, having no space after
the period. "U.S. He left." ends after "U.S." (a capital follows); "the U.S. Army" is cut
there too — no rule without statistics (Punkt) tells those apart.

`SentenceStream` segments text fed in pieces (a line, or a 10 MB line cut in chunks) in
time linear in its length: only the unfinished last sentence is carried over, and it is
cut at a space once it passes `max_chars`.
"""
from __future__ import annotations

import re

TERMINATORS = ".!?\u2026"
CLOSERS = "\"'\u201d\u2019\u00bb)]"
OPENERS = "\"'\u201c\u2018\u00ab(["
CJK_TERMINATORS = "\u3002\uff01\uff1f"  # 。！？
CJK_CLOSERS = "\u300d\u300f\uff09\u3011"  # 」』）】
# terminators, closers, then whitespace (optional right after a CJK terminator or closer), then the next word
_CANDIDATE = re.compile(rf"([{TERMINATORS}{CJK_TERMINATORS}]+)([{re.escape(CLOSERS)}{CJK_CLOSERS}]*)"
                        rf"(?:\s+|(?<=[{CJK_TERMINATORS}{CJK_CLOSERS}])\s*)"
                        rf"(?=[{re.escape(OPENERS)}]*([^\s{CJK_CLOSERS}]))")
_LAST_WORD = re.compile(r"\S*$")
# what may trail an undecided candidate: terminators, quotes, brackets and any whitespace
_UNDECIDED = (TERMINATORS + CLOSERS + OPENERS + CJK_TERMINATORS + CJK_CLOSERS
              + "".join(chr(c) for c in range(0x3001) if chr(c).isspace()))

# never end a sentence: titles before a name and abbreviations that always continue
NEVER_FINAL = frozenset("mr mrs ms dr prof sr jr st mt ft gen col lt sgt capt cmdr adm gov sen rep rev hon "
                        "fr e.g i.e cf vs viz approx ca dept".split())
# precede a number: "No. 5", "Fig. 2", "pp. 10-12"
BEFORE_NUMBER = frozenset("no nos vol vols fig figs pp p art sec ch eq ref".split())


def is_boundary(word: str, terminator: str, next_char: str, first: bool) -> bool:
    """Whether `terminator` after `word`, with `next_char` starting the next word, ends a sentence
    (`first`: the word is all of the sentence so far)."""
    if next_char.islower():
        return False
    if terminator != ".":  # ! ? ... and runs of them: the next word decides
        return True
    bare = word.lstrip(OPENERS).rstrip(".").lower()
    if bare in NEVER_FINAL:
        return False
    if bare in BEFORE_NUMBER and next_char.isdigit():
        return False
    stem = word.lstrip(OPENERS)[:-1]
    if len(stem) == 1 and stem.isalpha() and stem.isupper() and stem != "I":
        return False  # an initial
    return not (first and (stem.isdigit() or (len(stem) == 1 and stem.isalpha())))  # a list marker


def _decide(text: str, m, start: int, held: bool) -> bool:
    """Whether candidate `m` of `text` ends the sentence begun at `start` (`held`: text before it)."""
    if m.group(2) and m.end() == m.end(2) and m.group(2)[-1] in CJK_CLOSERS:
        return False  # 「行こう。」と言った: a quoted sentence inside one, no space after it
    found = _LAST_WORD.search(text, max(start, m.start() - 64), m.end(1))
    first = not held and found.start() - start <= 8 and not text[start:found.start()].strip()
    return is_boundary(found.group(), m.group(1), m.group(3), first)


def _boundaries(text: str):
    """(end of sentence, start of the next) for each sentence end in `text`."""
    start = 0
    for m in _CANDIDATE.finditer(text):
        if _decide(text, m, start, False):
            yield m.end(2), m.end()
            start = m.end()


def split_sentences(text: str) -> list:
    """The sentences of `text` (stripped, none empty)."""
    if not _CANDIDATE.search(text):  # most lines of one-sentence-per-line text
        text = text.strip()
        return [text] if text else []
    out, start = [], 0
    for end, start_next in _boundaries(text):
        out.append(text[start:end].strip())
        start = start_next
    out.append(text[start:].strip())
    return [s for s in out if s]


class SentenceStream:
    """Sentences of text fed piece by piece; `end()` closes the current unit (a line or a block).

    The unfinished sentence is held as `parts` (text with no sentence end in it, never
    scanned again) and `tail` (an undecided candidate plus 64 characters of context), so
    each character is scanned about once, however small the pieces."""

    def __init__(self, max_chars: int = 100_000) -> None:
        self.max_chars = max_chars
        self.parts, self.size, self.tail = [], 0, ""
        self.cut = 0  # sentences cut for being longer than max_chars

    def feed(self, text: str) -> list:
        """Complete sentences after appending `text`; the last, maybe unfinished, one is kept."""
        region, out, start = self.tail + text, [], 0
        for m in _CANDIDATE.finditer(region):
            if _decide(region, m, start, start == 0 and self.size > 0):
                out.append(("".join(self.parts) if start == 0 else "") + region[start:m.end(2)])
                self.parts, self.size, start = [], 0, m.end()
        self._hold(region[start:], out)
        return [s for s in (s.strip() for s in out) if s]

    def _hold(self, rest: str, out: list) -> None:
        """Keep `rest` as the unfinished sentence, cutting it at a space past max_chars."""
        while self.size + len(rest) > self.max_chars:  # a run-on "sentence"
            rest, self.parts, self.size = "".join(self.parts) + rest, [], 0
            cut = rest.rfind(" ", 0, self.max_chars)
            cut = cut if cut > 0 else self.max_chars
            out.append(rest[:cut])
            rest = rest[cut:]
            self.cut += 1
        keep = max(0, len(rest.rstrip(_UNDECIDED)) - 64)
        if keep:
            self.parts.append(rest[:keep])
            self.size += keep
        self.tail = rest[keep:]

    def line(self, text: str) -> list:
        """The sentences of `text` and of what is held: the end of a line ends a sentence."""
        if self.size or self.tail or len(text) > self.max_chars:
            return self.feed(text) + self.end()
        return split_sentences(text)  # the common case: a whole short line

    def end(self) -> list:
        """The sentences still held (the end of a line or a block ends a sentence)."""
        rest = ("".join(self.parts) + self.tail).strip()
        self.parts, self.size, self.tail = [], 0, ""
        return [rest] if rest else []
