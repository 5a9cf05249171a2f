"""The text a bake-off's run pretrains on (its plan's corpus, or an arm's own): built once under OUT, its
checksum kept in OUT/built.json (results.built_files), or the plan's own files."""
from __future__ import annotations

from pathlib import Path

from lmforge.bakeoff.corpus import documents as dictd_documents
from lmforge.bakeoff.corpus import write_documents
from lmforge.bakeoff.fingerprint import digest
from lmforge.bakeoff.results import built_files


def corpus_file(corpus: dict, out: Path) -> Path:
    """The corpus as one text file under OUT/corpus (written once; later runs read it, verified)."""
    source = corpus["source"]
    if source == "files":
        return Path(corpus["files"][0]) if len(corpus["files"]) == 1 else _joined(corpus["files"], out)
    path = out / "corpus" / f"{source}-{corpus['documents']}-{corpus.get('seed', 0)}.txt"
    built_files(out, [path], lambda: write_documents(_documents(corpus), path))
    return path


def _documents(corpus: dict) -> list:
    if corpus["source"] == "builtin":
        from lmforge.data.synthetic import documents as synthetic

        return [" ".join(doc) for doc in synthetic(corpus["documents"], seed=corpus.get("seed", 0))]
    return dictd_documents(corpus["source"], corpus["documents"], seed=corpus.get("seed", 0))


def _joined(files: list, out: Path) -> Path:
    path = out / "corpus" / f"files-{digest(files)}.txt"  # another list of files: another corpus

    def build() -> None:
        write_documents([Path(f).read_text(encoding="utf-8").strip() for f in files], path)

    built_files(out, [path], build)
    return path
