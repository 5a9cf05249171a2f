"""The training input of a tokenizer: files, folders or texts, read as `corpus shard` reads them.

Plain-text files go to the Rust trainer whole, unless one has a line too long for it or a character
the corpus reader cleans (a BOM, a CR, a NUL): then all of them are read by lines.py, cleaned as
corpus.clean cleans them. JSON lines and compressed files (gzip, bzip2, xz: told by their magic bytes,
whatever the name) are read by the corpus reader; texts from memory (a one-shot iterator is kept,
WordPiece and BPE reading the corpus twice).
"""
from __future__ import annotations

import functools
import os
import re
import warnings
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer as Backend

from lmforge.config.options import OptionsError, checked_text
from lmforge.tokenizer.lines import BLOCK, file_pieces, first_long_line, text_pieces
from lmforge.tokenizer.wrapper import TokenizerError


def _blank_file(file: Path) -> bool:
    """True when a file holds no text (stops at the first non-blank line)."""
    try:
        with open(file, encoding="utf-8") as handle:
            return not any(line.strip() for line in handle)
    except UnicodeDecodeError as err:
        raise TokenizerError(f"{file} is not UTF-8 text: {err}") from None


def _files(source) -> tuple:
    """(the files of `source`, checked, or None for a list or iterator of texts; whether one of them goes
    through the corpus reader: _through_reader), each file's kind probed once. `source` is a path or a list
    of paths (a folder stands for the files under it, as `corpus shard` reads it); a bare path is always a
    file name (a missing one is no one-text corpus), and a list counts as files when its items are path
    objects, or strings that all name existing files or folders."""
    from lmforge.data.corpus import expand_files

    if isinstance(source, str) and not source.strip():  # Path("") is ".": it trained on the working folder
        raise TokenizerError('source: the file name is empty ("" would be read as the working folder)')
    if isinstance(source, (str, os.PathLike)):
        source = [Path(source)]
    if not isinstance(source, (list, tuple)) or not source:
        return None, False
    if not all(isinstance(s, os.PathLike) for s in source):
        named = [s for s in source if isinstance(s, str) and os.path.exists(s)]
        if len(named) < len(source) and not any(map(os.path.isfile, named)):
            return None, False  # texts, not file names (a text "." names a folder)
        if len(named) < len(source):  # a mistyped file name would be trained on as a text
            other = next(s for s in source if not (isinstance(s, str) and os.path.exists(s)))
            raise FileNotFoundError(f"no such file: {str(other)[:80]!r}, while {named[0]} is one: pass file "
                                    "names only (pathlib.Path), or texts only (an iterator)")
    try:
        files = expand_files(source)  # a missing file: its FileNotFoundError, naming it
    except ValueError as err:  # a shard folder, a pipe, a folder with no files
        raise TokenizerError(str(err)) from None
    through = any(map(_through_reader, files))
    if not through and all(_blank_file(f) for f in files):
        raise TokenizerError(f"empty corpus: {', '.join(map(str, source))} hold no text")
    return files, through


def _texts(source: Iterable, seen: list):
    """The texts of `source`, counting the non-blank ones in seen[0]."""
    for text in source:
        if not isinstance(text, str):
            raise TokenizerError(f"source: corpus texts must be str, got {type(text).__name__}")
        seen[0] += bool(text.strip())
        yield text


def _through_reader(file: Path) -> bool:
    """Whether a file is JSON lines or compressed: read by the corpus reader (data/corpus.py), not as text.
    Compression is told by the magic bytes, as `corpus shard` tells it (a bzip2, an xz file or a gzip one
    without its .gz went to the Rust reader as text, refused as not UTF-8)."""
    from lmforge.data.corpus import ReadOptions
    from lmforge.data.openers import compression

    if file.name.lower().endswith(".gz") or ReadOptions().format_of(file) == "jsonl":
        return True
    try:
        return bool(compression(file))  # the magic bytes alone: no decompressor opened
    except ValueError as err:  # UTF-16 / UTF-32 text, named with the iconv line that converts it
        raise TokenizerError(str(err)) from None


def _reader_texts(files: list, seen: list, read=None):
    """Documents of JSONL / gzip / text files as the corpus reader gives them (its warnings included), read
    with `read` (a ReadOptions; None: its defaults)."""
    from lmforge.data.corpus import CorpusReader

    for document in CorpusReader(files, read):
        seen[0] += 1
        yield "\n".join(document)


@functools.cache
def _cleaned_utf8() -> tuple:
    """What corpus.clean changes, as bytes: (its one-byte characters, the lead bytes of its longer ones, a
    pattern of their UTF-8): C0 controls but the newline, DEL; C1 controls, the BOM, U+FFFE/FFFF."""
    from lmforge.data.corpus import CLEANED

    longer = [chr(c).encode() for c in sorted(CLEANED) if c >= 0x80]
    return (bytes(sorted(c for c in CLEANED if c < 0x80)), {u[:1] for u in longer},
            re.compile(b"|".join(map(re.escape, longer))))


def _unclean(file: Path) -> bool:
    """Whether a file holds a character the corpus reader strips or makes a space (a BOM, a CR, a NUL ...),
    read in blocks (the last 2 bytes of one kept with the next: a character cut between them)."""
    single, leads, longer = _cleaned_utf8()
    tail = b""
    with open(file, "rb") as handle:
        while block := handle.read(BLOCK):
            if len(block.translate(None, single)) < len(block):  # bytes.translate: at memory speed
                return True
            data = tail + block
            if any(lead in data for lead in leads) and longer.search(data):
                return True
            tail = block[-2:]
    return False


def _file_lines(files: list, seen: list):
    """The lines of plain-text files, long ones in pieces (lines.py), cleaned as the corpus reader cleans
    them (corpus.clean), with its warning: for files with a long line or such a character. A CRLF or a
    lone CR (an old Mac file's) ends a line, as the corpus reader ends it."""
    from lmforge.data.corpus import CorpusWarning, clean

    for file in files:
        stripped = 0
        for piece in file_pieces(file):
            # a line end, not a space (one before the end would be unigram's "▁" piece): a line each
            for line in re.findall(r"[^\n]*\n|[^\n]+$", piece.replace("\r\n", "\n").replace("\r", "\n")):
                line, n = clean(line)
                stripped += n
                seen[0] += bool(line.strip())
                yield line
        if stripped:
            warnings.warn(f"{file}: {stripped} control character(s) stripped", CorpusWarning, stacklevel=2)


class Corpus:
    """The training input, read once per training pass: plain-text files by the Rust reader (by
    lines.py where a line is too long for it or a character is one the corpus reader cleans), JSON lines
    and gzip files by the corpus reader, texts from memory (a one-shot iterator is kept); long texts go to
    the trainer in pieces (lines.py). `read` (a ReadOptions: a JSONL field, a document per file ...) sends
    every file through the corpus reader, read as `corpus shard` reads it with those options."""

    def __init__(self, source, read=None):
        # bytes iterate as numbers and a dict as its keys: neither is a list of texts
        if isinstance(source, (bytes, dict)) or not isinstance(source, (str, os.PathLike, Iterable)):
            raise TokenizerError(f"source: a file, a list of files or an iterable of texts, got "
                                 f"{type(source).__name__}")
        files, through = _files(source)
        if read is not None and files is None:  # texts are given as they are: nothing would read them
            raise OptionsError("read: options say how files are read; the texts given are taken as they are",
                               "read")
        self.read = read
        through_reader = files is not None and (read is not None or through)
        self.files = files if files is not None and not through_reader else None
        self.reader = files if through_reader else None
        self.texts = None if files is not None else \
            source if isinstance(source, (list, tuple, str)) else list(source)
        # plain files go to the Rust reader whole unless one has a line too long for it or a character it
        # would learn that no shard holds (a BOM, a CR, a NUL): then all of them are read by lines.py, a
        # training pass reading one source
        self.by_lines = self.files is not None and any(first_long_line(f) or _unclean(f) for f in self.files)
        self.passes = 0

    def _pass_texts(self, seen: list):
        """The texts of one pass (not for plain files the Rust reader takes whole: not by_lines)."""
        if self.files is not None:
            return _file_lines(self.files, seen)
        if self.reader is not None:
            return text_pieces(_reader_texts(self.reader, seen, self.read), ", ".join(map(str, self.reader)),
                               "document")
        return text_pieces(_texts(self.texts, seen), "the texts given")

    def train(self, backend: Backend, trainer) -> None:
        """One training pass of `backend` (in place); the first pass checks that there is text."""
        self.passes += 1
        if self.files is not None and not self.by_lines:
            backend.train([str(f) for f in self.files], trainer)
            return
        seen = [0]
        texts = self._pass_texts(seen)
        with warnings.catch_warnings():
            if self.passes > 1:  # the corpus reader's warnings about bad lines came with the first pass
                warnings.simplefilter("ignore")
            backend.train_from_iterator(texts, trainer)
        if not seen[0]:
            raise TokenizerError("empty corpus: no non-blank text to train on")

    def check_utf8(self) -> None:
        """A TokenizerError naming the first plain-text file that is not UTF-8 (and where), if one is not; an
        OptionsError naming the first text given that is not valid Unicode (a lone surrogate), if one is."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its long lines were reported by the pass that failed
            for file in self.files or ():
                for _ in file_pieces(file):
                    pass
        for i, text in enumerate(self.texts or ()):  # checked after a failed pass: no cost to a good one
            checked_text(text, "source", f"source[{i}]", "text")
