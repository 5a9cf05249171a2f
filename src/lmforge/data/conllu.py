"""CoNLL-U treebanks (Universal Dependencies): read the words, UPOS tags and basic trees, and write them.

A sentence is a block of word lines (ten tab-separated fields: ID FORM LEMMA UPOS XPOS FEATS HEAD
DEPREL DEPS MISC) ended by a blank line; "#" lines are comments. Multiword-token lines (ID "3-4")
and empty nodes (ID "5.1") are skipped: the tree is over the syntactic words. Records are those of
lmforge.data.treebank: heads are 0-based with -1 for the root (CoNLL-U's HEAD 0).

Every problem is an error naming the file and the line: bytes that are not UTF-8, a line without
ten fields, IDs out of order, a HEAD that is not a number or points outside the sentence, and a
sentence whose heads do not form a tree (no root, two roots, a cycle).
"""
from __future__ import annotations

import os
from pathlib import Path

from lmforge.data.treebank import tree_error
from lmforge.utils.atomic import atomic_write_text

FIELDS = 10


def _text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ValueError(f"{path}: line {line}: not valid UTF-8 (byte {data[err.start]:#04x})") from None


def _word(path: Path, number: int, line: str, expected: int) -> tuple | None:
    """(form, upos, head, deprel) of a word line; None for a multiword token or an empty node."""
    fields = line.split("\t")
    if len(fields) != FIELDS:
        raise ValueError(f"{path}: line {number}: {len(fields)} tab-separated fields, CoNLL-U has {FIELDS} "
                         f"(ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC)")
    ident = fields[0]
    if "-" in ident or "." in ident:
        return None
    if ident != str(expected):
        raise ValueError(f"{path}: line {number}: word ID {ident!r}, expected {expected}")
    head = fields[6]
    if not head.isdigit():
        raise ValueError(f"{path}: line {number}: HEAD {head!r} is not a word number (0 for the root)")
    return fields[1], fields[3], int(head) - 1, fields[7]


def _record(path: Path, words: list, first: int) -> dict:
    forms, upos, heads, deprels = (list(column) for column in zip(*words))
    for i, h in enumerate(heads):
        if h >= len(forms):
            raise ValueError(f"{path}: line {first + i}: HEAD {h + 1} is past the sentence's "
                             f"{len(forms)} words")
    error = tree_error(heads)
    if error:
        raise ValueError(f"{path}: line {first}: the sentence's heads are not a tree: {error}")
    return {"words": forms, "upos": upos, "heads": heads, "deprels": deprels, "links": [], "line": first}


def read_conllu(path: str | os.PathLike) -> list:
    """The sentences of a CoNLL-U file as treebank records (see the module docstring)."""
    path = Path(path)
    records, words, first = [], [], 0
    lines = _text(path).split("\n")
    for number, line in enumerate(lines + [""], 1):  # a final blank line ends the last sentence
        line = line.rstrip("\r")
        if not line.strip():
            if words:
                records.append(_record(path, words, first))
            words = []
            continue
        if line.startswith("#"):
            continue
        word = _word(path, number, line, len(words) + 1)
        if word is not None:
            first = first if words else number
            words.append(word)
    if not records:
        raise ValueError(f"{path}: no sentences (CoNLL-U: one word per line, ten tab-separated fields)")
    return records


def write_conllu(records: list, path: str | os.PathLike) -> Path:
    """Write treebank records as CoNLL-U (LEMMA, XPOS, FEATS, DEPS and MISC left as "_")."""
    lines = []
    for n, r in enumerate(records, 1):
        lines += [f"# sent_id = {n}", f"# text = {' '.join(r['words'])}"]
        for i, (word, upos, head, deprel) in enumerate(zip(r["words"], r["upos"], r["heads"],
                                                            r["deprels"]), 1):
            lines.append("\t".join([str(i), word, "_", upos, "_", "_", str(head + 1), deprel, "_", "_"]))
        lines.append("")
    path = Path(path)
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path
