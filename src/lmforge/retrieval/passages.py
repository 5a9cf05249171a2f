"""Passages: a corpus cut into blocks of about 100 words, each with an id and a title (DPR,
Karpukhin et al. 2020, sec. 4.1: Wikipedia articles split into disjoint 100-word passages).

Sources: the built-in corpus (one document per entity of the synthetic World: a biography per
person, a note per city, a review per product; titled by the entity), plain text or JSONL files
(read by lmforge.data.corpus; titled by file name and document number), or a passages JSONL
file written here ({"id", "title", "text"} per line).
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from lmforge.config.options import checked_argument
from lmforge.data.corpus import ReadOptions, expand_files, read_range
from lmforge.data.synthetic import biography, city_note, review
from lmforge.data.world import World
from lmforge.utils.atomic import atomic_write_text
from lmforge.utils.errors import OptionsError, checked_text, shown
from lmforge.utils.jsontext import loads

WORDS, MAX_WORDS = 100, 100_000  # words per passage (DPR's block size), and its bound (IndexOptions.words)


@dataclass(frozen=True)
class Passage:
    """One retrievable block of text: a unique id, the title of its document, its words."""

    id: str
    title: str
    text: str


def split_words(text: str, words: int = WORDS) -> list:
    """`text` cut into disjoint runs of about `words` words (the chunks share the words evenly,
    so no tail of three words becomes a passage of its own)."""
    if words < 1:
        raise ValueError(f"words must be positive, got {words}")
    tokens = text.split()
    if not tokens:
        return []
    n = max(1, round(len(tokens) / words))
    bounds = [round(i * len(tokens) / n) for i in range(n + 1)]
    return [" ".join(tokens[a:b]) for a, b in zip(bounds, bounds[1:])]


def passages_from_documents(documents, words: int = WORDS) -> list:
    """(title, text) documents -> Passages with ids "0", "1", ... in order."""
    out = []
    for title, text in documents:
        for chunk in split_words(text, words):
            out.append(Passage(str(len(out)), title, chunk))
    return out


def builtin_documents(seed: int = 0, world: World | None = None) -> list:
    """(title, text) of the built-in corpus: one document per person, city and product of the World."""
    w = world or World(seed)
    rng = random.Random(seed + 7)
    docs = [(p.name, " ".join(biography(w, i, rng))) for i, p in enumerate(w.people)]
    docs += [(c.name, " ".join(city_note(w, i, rng))) for i, c in enumerate(w.cities)]
    docs += [(f"{p.maker} {p.name}", " ".join(review(w, i, rng)[0])) for i, p in enumerate(w.products)]
    return docs


def file_documents(files, options: ReadOptions | None = None):
    """(title, text) of the documents of text / JSONL files: titled "<file stem> <n>"."""
    options = options or ReadOptions()
    for path in expand_files([files] if isinstance(files, (str, Path)) else files):
        for k, sentences in enumerate(read_range(path, options), 1):
            yield f"{path.stem} {k}", " ".join(sentences)


def write_passages(passages: list, path) -> Path:
    """Passages as JSONL ({"id", "title", "text"} per line)."""
    path = Path(path)
    lines = (json.dumps(asdict(p), ensure_ascii=False) + "\n" for p in passages)
    return atomic_write_text(path, "".join(lines))


def _passage(line: str, where: str) -> Passage:
    try:
        record = loads(line)
    except ValueError as err:
        raise ValueError(f"{where}: not JSON ({err.msg})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected an object with id, title and text")
    for key, kinds in (("id", (str, int)), ("title", str), ("text", str)):  # an id may be a number
        if not isinstance(record.get(key), kinds) or isinstance(record.get(key), bool):
            raise ValueError(f"{where}: field {key!r} missing or not a string")
        record_text(str(record[key]), where, key, blank=True)  # a wordless passage is indexed: a test says so
    return Passage(str(record["id"]), str(record["title"]), str(record["text"]))


def record_text(value: str, where: str, key: str, blank: bool = False) -> str:
    """`value`, a text of valid Unicode (blank: whitespace alone allowed); a ValueError naming the file's line
    and field otherwise: a lone surrogate failed later naming no file (an index build's write, training), a
    blank question was trained on and scored (a query needs words), a blank context a wordless positive."""
    checked_text(value, None, f"{where}: field {key!r}")  # the one rule (an OptionsError: a ValueError)
    if not blank and not value.strip():
        raise ValueError(f"{where}: field {key!r} is blank: it needs words")
    return value


def utf8_lines(path):
    """(number, text) of each line of the file `path`, read as UTF-8 a line at a time; a ValueError naming
    the file and line where one is not UTF-8 (a text-mode read says neither)."""
    with open(path, "rb") as handle:
        for n, raw in enumerate(handle, 1):
            try:
                yield n, raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}: line {n}: not valid UTF-8 (byte {raw[err.start]:#04x} at column "
                                 f"{err.start + 1}); save the file as UTF-8") from None


def read_passages(path) -> list:
    """Passages of a JSONL file written by write_passages; a bad line or a repeated id is an
    error naming the file and line."""
    path, out, seen = Path(path), [], set()
    for n, line in utf8_lines(path):
        if line.strip():
            p = _passage(line, f"{path}: line {n}")
            if p.id in seen:
                raise ValueError(f"{path}: line {n}: passage id {p.id!r} repeated")
            seen.add(p.id)
            out.append(p)
    if not out:
        raise ValueError(f"{path}: no passages")
    return out


def is_passages_file(source) -> bool:
    """Whether `source` is a passages JSONL (its first line has "id", "title" and "text"): read as its
    passages, not cut into windows of words."""
    path = Path(source)
    if not (path.is_file() and path.suffix == ".jsonl"):
        return False
    with open(path, "rb") as handle:  # a bad byte is for read_passages to name, with its line
        first = handle.readline().decode("utf-8", "replace")
    try:
        head = loads(first)
    except ValueError:
        return False
    return isinstance(head, dict) and {"id", "title", "text"} <= set(head)


def load_passages(source: str | None, seed: int = 0, words: int = WORDS) -> list:
    """Passages from a source: None or "builtin" (the built-in corpus), a passages JSONL file
    (lines with "id", "title" and "text"), or text / JSONL corpus files and directories."""
    if not (source is None or isinstance(source, (str, os.PathLike))) or not str(source).strip():
        # "" read the working folder whole; a number or bytes failed inside pathlib
        raise OptionsError(f"passages must be \"builtin\", a file or a folder, got {shown(source)}",
                           "passages")
    words = checked_argument("words", "int", {"low": 1, "high": MAX_WORDS}, words)  # True is no window size
    if source in (None, "builtin"):
        return passages_from_documents(builtin_documents(seed), words)
    if is_passages_file(source):
        return read_passages(source)
    passages = passages_from_documents(file_documents(source), words)
    if not passages:  # e.g. JSONL records whose "text" is no string: nothing to index
        raise ValueError(f"{source}: no passages (no text; a passages file has id, title and text strings "
                         f"per line)")
    return passages
