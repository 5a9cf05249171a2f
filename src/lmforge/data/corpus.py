"""Corpus ingestion: text files, JSONL, gzip, bzip2 and xz, streamed into documents of sentences.

Formats (by file name; gzip, bzip2 and xz are read transparently whatever the name — each is told
by its magic bytes):

- plain text: a document per blank-line-separated block (document="block"), or per file
  (document="file"); every line ends a sentence (the one-sentence-per-line layout of BERT's
  data) unless join_lines=True (hard-wrapped prose: lines of a block are joined first);
- JSONL (.jsonl, .ndjson, .json): one document per line, its text in `text_field`; the
  text's own lines end sentences as in plain text.

A line ends at LF, CRLF or a lone CR (old Mac OS text), alike. Each line is segmented by
`lmforge.data.segment`. Files are read line by line in pieces
of at most 1 MiB (cut at a UTF-8 character boundary), so a 10 MB line is never held
whole, and memory stays flat whatever the file size (a document is cut in parts beyond
`max_document_chars`, a sentence beyond `max_sentence_chars`).

Bad text never stops a run deep in a loop:

- empty files, files without text: a `CorpusWarning`;
- bytes that are not UTF-8: errors="skip" (default) drops the piece of the line holding them
  — a wrong-encoding line is more likely noise than text, and a replacement character would
  become [UNK] tokens in training — with one warning per file naming the file, the count and
  the byte offset of the first bad byte (in the decompressed text for gzip, bzip2, xz);
  errors="replace" keeps the line with U+FFFD in place of the bad bytes (same warning);
  errors="strict" raises ValueError at the first bad byte;
- control characters (C0 and C1 but tab and line ends, DEL, U+FEFF byte-order marks,
  U+FFFE/U+FFFF) are stripped, tabs and vertical whitespace become spaces, counted in a warning;
- a JSONL line that is not JSON, or lacks a string `text_field`: skipped, counted in a warning;
- a truncated or corrupt gzip, bzip2 or xz file: the text before the damage is kept, with a warning.
"""
from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

from lmforge.data.openers import STREAM_ERRORS, damage, open_binary, read_some, stream_damage
from lmforge.data.read_options import DOCUMENTS, ERRORS, FORMATS, ReadOptions  # noqa: F401 (read here)
from lmforge.data.segment import SentenceStream
from lmforge.utils.atomic import file_kind, identity
from lmforge.utils.jsontext import loads

CHUNK = 1 << 20  # bytes read at once from a long line
LINE_ENDS = (b"\n", b"\r")  # LF, CRLF and a lone CR each end a line
SHARD_FORMAT = "lmforge-shards"  # the "format" of a shard folder's manifest.json (shards.py writes it)
SHARD_TOKENS = re.compile(r"shard-\d{5,}\.bin")  # a shard's token ids (shards.py names them so)
MAX_JSON_LINE = 1 << 28  # a JSONL record longer than this (bytes) is skipped, not parsed

_CONTROL = {c: None for c in [*range(0x20), 0x7F, *range(0x80, 0xA0), 0xFEFF, 0xFFFE, 0xFFFF]}
_CONTROL.update({c: " " for c in (0x09, 0x0B, 0x0C, 0x0D)})
_CONTROL.pop(0x0A)
_CONTROL_RE = re.compile("[" + "".join(re.escape(chr(c)) for c in _CONTROL) + "]")
CLEANED = frozenset(_CONTROL)  # the code points clean() strips or makes spaces (the newline is kept)


class CorpusWarning(UserWarning):
    """Text that was skipped, cut or cleaned while reading a corpus."""


def clean(text: str) -> tuple:
    """(text without control characters, tabs and CRs as spaces; number of characters stripped)."""
    out = text.translate(_CONTROL)
    return out, len(text) - len(out)  # tabs and CRs made spaces are not counted


@dataclass
class FileStats:
    """What was wrong with one file (or byte range of it)."""

    path: Path
    bytes: int = 0
    documents: int = 0
    bad_utf8: int = 0
    first_bad: int = -1
    control: int = 0
    bad_json: int = 0
    no_text_field: int = 0
    cut_documents: int = 0
    cut_sentences: int = 0
    damaged: str = ""
    problems: list = field(default_factory=list)

    def report(self, whole_file: bool, errors: str) -> list:
        """The warnings this file deserves (one line each)."""
        p = self.path
        out = [f"{p} is empty"] if whole_file and not self.bytes else []
        if whole_file and self.bytes and not self.documents:
            out.append(f"{p} holds no text")
        if self.bad_utf8:
            what = "skipped" if errors == "skip" else "kept with U+FFFD"
            out.append(f"{p}: {self.bad_utf8} piece(s) of lines not UTF-8, {what} (first bad byte at offset "
                       f"{self.first_bad})")
        if self.control:
            out.append(f"{p}: {self.control} control character(s) stripped")
        if self.bad_json or self.no_text_field:
            out.append(f"{p}: skipped {self.bad_json} line(s) that are not JSON and {self.no_text_field} "
                       f"without a string text field")
        if self.cut_documents or self.cut_sentences:
            out.append(f"{p}: cut {self.cut_documents} over-long document(s) and {self.cut_sentences} "
                       f"over-long sentence(s)")
        if self.damaged:
            out.append(f"{p}: {self.damaged}; kept the text before it")
        return out


def _utf8_cut(piece: bytes) -> int:
    """Where to cut `piece` so that no UTF-8 character is split (its length, or a little less)."""
    i = len(piece)
    while i > len(piece) - 3 and piece[i - 1] & 0xC0 == 0x80:  # continuation bytes
        i -= 1
    return i - 1 if piece[i - 1] >= 0xC0 else len(piece)  # a lead byte: its character goes on


def _line_cut(data: bytes) -> int:
    """Just after the last line end (LF, CRLF or a lone CR) of `data` (0: none), but inside no CRLF."""
    cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
    if cut == len(data) and data.endswith(b"\r"):  # half a CRLF, maybe: its LF would make a false blank line
        cut = max(data.rfind(b"\n", 0, -1), data.rfind(b"\r", 0, -1)) + 1 or len(data) - 1
    return cut


def _pieces(handle, start: int, end: int | None, stats):
    """(bytes, offset, ends_line) for the lines starting in [start, end): whole lines read ~CHUNK at a
    time, or, for a line longer than CHUNK, one piece of it (ends_line False but for its last piece). A
    damaged compressed stream ends the text where the damage starts (said in stats), its last document
    kept."""
    offset, carry, eof, error = start, b"", False, None
    while True:
        data = carry
        if not eof:
            want = CHUNK - len(carry) if end is None else min(CHUNK, end - offset) - len(carry)
            got, error = read_some(handle, want) if want > 0 else (b"", None)
            eof, data = error is not None or len(got) < want or want <= 0, carry + got
        if not data:
            if error is not None:  # the text before it was read: it ends there, as a file would
                stats.damaged = damage(handle, error)
            return
        cut = len(data) if eof else _line_cut(data)  # at the end every line is whole
        cut = cut or _utf8_cut(data)  # no line end: a piece of a long line
        piece, carry = data[:cut], data[cut:]
        yield piece, offset, piece.endswith(LINE_ENDS) or (eof and not carry)
        offset += len(piece)


def _decode(piece: bytes, offset: int, stats: FileStats, errors: str) -> str | None:
    """A piece as text, by the errors policy (None: skipped)."""
    try:
        text = piece.decode("utf-8")
    except UnicodeDecodeError as err:
        if errors == "strict":
            raise ValueError(f"{stats.path} is not UTF-8 text (byte offset {offset + err.start})") from None
        stats.bad_utf8 += 1
        stats.first_bad = offset + err.start if stats.first_bad < 0 else stats.first_bad
        if errors == "skip":
            return None
        text = piece.decode("utf-8", "replace")
    if _CONTROL_RE.search(text):
        text, changed = clean(text)
        stats.control += changed
    return text


def _decode_lines(block: bytes, offset: int, stats: FileStats, errors: str) -> list:
    """The lines of a block of whole lines; a line that is not UTF-8 is handled on its own."""
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError:
        lines, at = [], offset
        for line in block.splitlines(keepends=True):  # bytes split at LF, CRLF and CR alone
            text = _decode(line.rstrip(b"\r\n"), at, stats, errors)
            lines += [] if text is None else [text]  # a skipped line is no blank line
            at += len(line)
        return lines
    if "\r" in text:  # CRLF (Windows) and a lone CR (old Mac OS) end lines as LF does
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if _CONTROL_RE.search(text):
        text, changed = clean(text)
        stats.control += changed
    lines = text.split("\n")
    return lines[:-1] if block.endswith(LINE_ENDS) else lines


def _text_events(handle, start, end, opts: ReadOptions, stats: FileStats):
    """(text, ends_line) events of a text file range."""
    for piece, offset, ends in _pieces(handle, start, end, stats):
        stats.bytes += len(piece)
        if not ends:  # a piece of a long line
            text = _decode(piece, offset, stats, opts.errors)
            yield ("" if text is None else text), False
            continue
        for line in _decode_lines(piece, offset, stats, opts.errors):
            yield line, True


def _jsonl_events(handle, start, end, opts: ReadOptions, stats: FileStats):
    """(text, ends_line) events of a JSONL file range, None after each record (a document)."""
    parts, size = [], 0  # the pieces of a long line so far
    for piece, offset, ends in _pieces(handle, start, end, stats):
        stats.bytes += len(piece)
        if not ends:
            parts += [piece] if size + len(piece) <= MAX_JSON_LINE else []
            size += len(piece)
            continue
        at = offset - size
        for line in piece.splitlines(keepends=True):  # a raw CR is a line end: JSON escapes one in a string
            n, line = len(line) + size, line.rstrip(b"\r\n")
            if parts:  # joined once: a long record is held in as few copies as it can be
                line, parts, size = b"".join([*parts, line]), [], 0
            yield from _record(line, at, opts, stats)
            at += n


def _record(line: bytes, offset: int, opts: ReadOptions, stats: FileStats):
    """The events of one JSONL line: its text field's lines, then None."""
    text = _decode(line, offset, stats, opts.errors) if line and not line.isspace() else None
    if text is None:
        return
    try:
        record, text = loads(text, strict=False), None  # control characters were cleaned by _decode
    except ValueError:
        stats.bad_json += 1
        return
    value = record.get(opts.text_field) if isinstance(record, dict) else None
    if not isinstance(value, str):
        stats.no_text_field += 1
        return
    if _CONTROL_RE.search(value):  # "\u0000" escapes decode to control characters too
        value, changed = clean(value)
        stats.control += changed
    for line_text in value.split("\n"):  # a long line in pieces, cut by max_document_chars as in text files
        cuts = range(0, len(line_text), CHUNK)
        yield from ((line_text[at:at + CHUNK], at == cuts[-1]) for at in cuts)
        yield from () if cuts else (("", True),)
    yield None


def _assemble(events, opts: ReadOptions, stats: FileStats, block: bool):
    """Documents (lists of sentences) from text events; None or a blank line (block) ends one."""
    stream = SentenceStream(opts.max_sentence_chars)
    doc, size, blank, parts = [], 0, True, 0  # parts: of the document, yielded so far (cut in parts)
    for event in chain(events, (None,)):  # None: the end of the last document
        if event is not None:
            text, ends = event
            blank = blank and not text.strip()
            if ends and not opts.join_lines:
                got = stream.line(text)
            else:
                got = stream.feed(text)
                got += (stream.feed(" ") if not blank else stream.end()) if ends else []
            doc += got
            size += sum(map(len, got))
        if event is None or (ends and blank and block):
            doc += stream.end()
            if doc:
                stats.cut_documents += parts == 1  # a second part: the document was cut (counted once)
                stats.documents += 1
                yield doc
            doc, size, blank, parts = [], 0, True, 0
            continue
        blank = blank or ends
        if size > opts.max_document_chars:  # cut at a sentence end; the rest is the next part
            stats.cut_documents += parts == 1
            stats.documents += 1
            yield doc
            doc, size, parts = [], 0, parts + 1
    stats.cut_sentences += stream.cut


def read_range(path, opts: ReadOptions, start: int = 0, end: int | None = None, warn: bool = True):
    """The documents of one file, or of its byte range [start, end) (range ends from split_points)."""
    path = Path(path)
    stats = FileStats(path)
    fmt, handle = opts.format_of(path), None
    try:
        with open_binary(path) as handle:
            if start:
                handle.seek(start)
            events = (_jsonl_events if fmt == "jsonl" else _text_events)(handle, start, end, opts, stats)
            yield from _assemble(events, opts, stats, block=fmt == "text" and opts.document == "block")
    except (*STREAM_ERRORS, OSError) as err:
        if not stream_damage(handle, err):  # a plain file's read error is no damaged stream
            raise
        stats.damaged = damage(handle, err)
    stats.problems = stats.report(start == 0 and end is None, opts.errors)
    for message in stats.problems if warn else ():
        warnings.warn(message, CorpusWarning, stacklevel=2)
    return stats


def is_shard_dir(path) -> bool:
    """Whether `path` is a folder `lmforge corpus shard` wrote (every reader's one rule): its manifest.json
    names the shards' format, or is damaged (no JSON: reading it as shards says so), or is missing beside
    shard files; another JSON is text."""
    manifest = Path(path) / "manifest.json"
    if not manifest.is_file():  # lost: its token ids are still no text (reading it as shards says so)
        return Path(path).is_dir() and any(SHARD_TOKENS.fullmatch(p.name) for p in Path(path).iterdir())
    try:
        head = loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True
    return isinstance(head, dict) and head.get("format") == SHARD_FORMAT


def _walk(folder: Path) -> list:
    """The files under `folder`, sorted, but those of shard folders inside it (an earlier run's token ids,
    manifest and tokenizer, read as text, would be junk documents), with a warning naming each."""
    found = _left_out(folder, sorted(folder.rglob("*")))
    shard_dirs = {p.parent for p in found
                  if (p.name == "manifest.json" or SHARD_TOKENS.fullmatch(p.name)) and is_shard_dir(p.parent)}
    for skipped in sorted(shard_dirs):
        warnings.warn(f"{skipped}: skipped, an lmforge shard folder (token ids), not text",
                      CorpusWarning, stacklevel=3)
    return [p for p in found if shard_dirs.isdisjoint(p.parents)]


def _left_out(folder: Path, entries: list) -> list:
    """The regular files of a folder's `entries`; one warning counts the rest: hidden (.git, a killed write's
    fresh folders: utils/atomic), linked folders (a link may loop), pipes, sockets, devices, broken links."""
    dots = [[part.startswith(".") for part in p.relative_to(folder).parts] for p in entries]
    shown = [p for p, d in zip(entries, dots) if not any(d)]
    special = sum(not p.is_file() and not p.is_dir() for p in shown)
    counts = {"hidden": sum(d[-1] and not any(d[:-1]) for d in dots),  # counted once, at its top
              "linked folder(s) (not followed)": sum(p.is_dir() and p.is_symlink() for p in shown),
              "pipe(s), socket(s), device(s) or broken link(s)": special}
    if any(counts.values()):
        warnings.warn(f"{folder}: left out " + "; ".join(f"{n} {what}" for what, n in counts.items() if n),
                      CorpusWarning, stacklevel=4)
    return [p for p in shown if p.is_file()]


def expand_files(files) -> list:
    """The files named (a directory stands for the files under it, sorted, shard folders left out),
    checked to exist, a file named again said; a shard folder named itself is a ValueError (its files are
    no text)."""
    out = []
    for f in map(Path, files):
        if f.is_dir() and is_shard_dir(f):
            raise ValueError(f"{f} is an lmforge shard folder, not text (pretrain's data, --data, takes it "
                             "alone)")
        if f.is_dir():
            out += _walk(f)
        elif f.is_file():
            out.append(f)
        elif f.exists():  # a pipe or a device (/dev/zero): no size to plan shards by, maybe no end
            raise ValueError(f"{f} is not a regular file or a folder ({file_kind(f)})")
        else:
            raise FileNotFoundError(f"no such file: {f}")
    if not out:
        raise ValueError(f"no files in {', '.join(map(str, files))}")
    return _said_twice(out)


def _said_twice(files: list) -> list:
    """`files` as named, a file named again (twice, by a folder and by name, or by a link) said: its
    documents count once more (the one way to weigh a file up, kept), where overlapping globs did it
    unsaid."""
    seen: dict = {}
    for f in files:
        first = seen.setdefault(identity(f), f)  # utils.atomic's, as writes_over tells a hard link
        if first is not f:
            warnings.warn(f"{f}: the same file as {first}, named again: its documents are read again",
                          CorpusWarning, stacklevel=3)
    return files


class CorpusReader:
    """Documents (lists of sentence strings) of several files, streamed; `problems` lists the warnings."""

    def __init__(self, files, options: ReadOptions | None = None, **kw) -> None:
        self.files = expand_files([files] if isinstance(files, (str, os.PathLike)) else files)
        self.options = options or ReadOptions(**kw)
        self.problems: list = []

    def __iter__(self):
        self.problems = []
        for path in self.files:
            stats = yield from read_range(path, self.options)
            self.problems += stats.problems
