"""The text a bake-off's run pretrains on (its plan's corpus, or an arm's own): built once under OUT, its
checksum kept in OUT/built.json (results.built_files), or the plan's own files, read where they are.

A plan's own files (source: files), one or many, are read by lmforge.data.corpus as pretraining reads them
(gzip, JSONL, bytes that are not UTF-8 skipped with a warning naming the file), and each file's checksum is
kept in OUT/built.json at the run's first use of it. A file missing or changed since is a CorpusError
naming it, on every use (the run's start, each arm's sampling and pretraining): the finished arms were
trained on the text as it was (and the tokenizer too), so going on would mix two corpora in one result
table unsaid, and rerunning them unasked would throw hours away. The user says which: restore the file,
or run with a fresh --out. A file is read for its checksum once a process while its size and times stay as
they were (results.file_sha256): an edit changes them, and is caught at the next use.
"""
from __future__ import annotations

from pathlib import Path

from lmforge.bakeoff.corpus import documents as dictd_documents
from lmforge.bakeoff.corpus import write_documents
from lmforge.bakeoff.layout import CORPUS
from lmforge.bakeoff.results import built_files, held_to_record

SOURCES = "sources"  # in OUT/built.json: {a plan's corpus file, as the plan names it: its sha256}


class CorpusError(ValueError):
    """A plan's corpus file missing, or changed since the run first read it: the message names the file."""


def corpus_files(corpus: dict, out: Path) -> list:
    """The files of a corpus, read as pretraining reads them: the plan's own (verified), or one text file
    built under OUT/corpus (written once; later runs read it, verified)."""
    source = corpus["source"]
    if source == "files":
        return verified_sources(corpus["files"], out)
    path = out / CORPUS / f"{source}-{corpus['documents']}-{corpus.get('seed', 0)}.txt"
    built_files(out, [path], lambda: write_documents(_documents(corpus), path))
    return [path]


def _documents(corpus: dict) -> list:
    if corpus["source"] == "builtin":
        from lmforge.data.synthetic import documents as synthetic

        return [" ".join(doc) for doc in synthetic(corpus["documents"], seed=corpus.get("seed", 0))]
    return dictd_documents(corpus["source"], corpus["documents"], seed=corpus.get("seed", 0))


def verified_sources(files: list, out: Path) -> list:
    """The plan's corpus files as paths, each checked against the checksum OUT/built.json keeps of it (one
    read for the first time recorded): a CorpusError naming a file missing or changed since."""
    for name in files:
        if not Path(name).is_file():  # a folder too: its checksum would be no one file's
            raise CorpusError(f"{name}: {'not a file' if Path(name).exists() else 'no such file'} (a corpus "
                              "file of the plan)")
    held_to_record(out, {name: name for name in files}, CorpusError, "since this run first read it",
                   ": its finished arms were trained on the text as it was; restore the file, or run with a "
                   "fresh --out", section=SOURCES)
    return [Path(name) for name in files]
