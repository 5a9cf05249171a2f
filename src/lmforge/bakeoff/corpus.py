"""Real text for the bake-off, from Debian's dictd packages: documents and a second domain.

- `gcide`: the Collaborative International Dictionary of English (package dict-gcide);
- `foldoc`: the Free On-line Dictionary of Computing (package dict-foldoc);
- `jargon`: the Jargon File (package dict-jargon).

A dictd file is gzip-readable text in which an entry starts with an unindented line (its
headword, in GCIDE also its pronunciation and part of speech) followed by indented lines (its
body). A document is an entry's body as prose: markup, source marks, etymologies and dates
removed. The headword line is dropped, so GCIDE's documents never show a part of speech next to
its definition (the label of the gcide-pos task) and FOLDOC's never show their <topic> tag (the
label of foldoc-topic). Nothing is installed here: a missing file names its package.
"""
from __future__ import annotations

import gzip
import random
import re
from pathlib import Path

from lmforge.utils.atomic import atomic_write_text

DICTD = Path("/usr/share/dictd")
SOURCES = {"gcide": ("gcide.dict.dz", "dict-gcide"), "foldoc": ("foldoc.dict.dz", "dict-foldoc"),
           "jargon": ("jargon.dict.dz", "dict-jargon")}
MIN_WORDS = 8  # shorter bodies ("Same as X.") teach little and are mostly cross-references
_BRACKETS = re.compile(r"\[[^\[\]]*\]")  # [1913 Webster], [L. abdicatio: cf. F.], [{Jargon File}]
_MARKS = re.compile(r"--[A-Z][\w. ]*\.|\\[^\\]*\\|\(\d{4}-\d\d-\d\d\)|<[a-z ,]+>|(?<!\w)\d+\.\s|\(\w\)\s")


def dictd_path(name: str, root: Path = DICTD) -> Path:
    """The dictd file of source `name`; FileNotFoundError naming the Debian package when missing."""
    if name not in SOURCES:
        raise ValueError(f"dictionary {name!r} is not one of {', '.join(SOURCES)}")
    filename, package = SOURCES[name]
    path = Path(root) / filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: install the Debian package {package} "
                                f"(apt-get install {package})")
    return path


def entries(path) -> list:
    """(headword line, body lines) of every entry of a dictd file, the database's own 00-entries skipped."""
    text = gzip.open(path).read().decode("utf-8", "replace")
    out: list = []
    for line in text.splitlines():
        if line and not line[0].isspace():
            out.append((line.strip(), []))
        elif out and line.strip():
            out[-1][1].append(line.strip())
    return [(head, body) for head, body in out if not head.startswith("00-database")]


def clean(body: list) -> str:
    """An entry's body lines -> one line of prose (brackets, braces, source marks, dates removed)."""
    text = " ".join(body)
    previous = None
    while previous != text:  # nested brackets go from the inside out
        previous, text = text, _BRACKETS.sub(" ", text)
    text = _MARKS.sub(" ", text.replace("{", "").replace("}", ""))  # {cross reference} -> the words
    return " ".join(text.split())


def documents(name: str, n: int, seed: int = 0, root: Path = DICTD) -> list:
    """n documents (one line of prose each) of dictionary `name`, a seeded sample of its entries of
    at least MIN_WORDS words, in the dictionary's order."""
    docs = [doc for doc in (clean(body) for _, body in entries(dictd_path(name, root)))
            if len(doc.split()) >= MIN_WORDS]
    if len(docs) > n:
        keep = sorted(random.Random(seed).sample(range(len(docs)), n))
        docs = [docs[i] for i in keep]
    return docs


def write_documents(docs: list, path) -> Path:
    """Documents as a text file pretraining reads (lmforge.data.corpus): one block per document,
    its sentences segmented by the reader."""
    path = Path(path)
    return atomic_write_text(path, "\n\n".join(docs) + "\n")


_TOPIC = re.compile(r"^<([a-z ]+)[,>]")  # the first of an entry's topics


def topic_task(n_per_label: int = 100, seed: int = 0, labels: int = 4, root: Path = DICTD) -> dict:
    """FOLDOC's in-domain task: an entry's topic tag (<language>, <networking>, ...) from its
    definition (tag removed). The `labels` most frequent topics, n_per_label entries of each;
    train / validation / test splits (80/10/10), seeded."""
    by_topic: dict = {}
    for _, body in entries(dictd_path("foldoc", root)):
        match = _TOPIC.match(body[0]) if body else None
        text = clean(body)
        if match and len(text.split()) >= MIN_WORDS:
            by_topic.setdefault(match.group(1), []).append(" ".join(text.split()[:48]))
    top = sorted(by_topic, key=lambda t: (-len(by_topic[t]), t))[:labels]
    rng = random.Random(seed)
    records = []
    for topic in sorted(top):
        pool = by_topic[topic]
        rng.shuffle(pool)
        records += [{"text": text, "label": topic} for text in pool[:n_per_label]]
    rng.shuffle(records)
    n = len(records)
    return {"train": records[:int(0.8 * n)], "validation": records[int(0.8 * n):int(0.9 * n)],
            "test": records[int(0.9 * n):]}
