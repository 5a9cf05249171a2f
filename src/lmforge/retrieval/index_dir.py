"""An index directory's manifest, index.json: written last by `lmforge index build`, it records the
passage count, the sha256 of passages.jsonl and of each part's own manifest (bm25/manifest.json and,
with a model, dense/manifest.json; each part checks its files against its manifest). Queries look
passages up by their row in the parts' results, so passages.jsonl is checked on every read: a swapped,
cut or edited line would otherwise report another passage's text under a score, or fail deep inside.
A part from another build (its manifest's checksum is not the recorded one) is refused the same way,
and a folder the manifest does not list (a dense/ left from an earlier build) is not part of the index.
"""
from __future__ import annotations

import json
from pathlib import Path

from lmforge.retrieval.passages import read_passages
from lmforge.utils import jsontext
from lmforge.utils.atomic import atomic_write_text
from lmforge.utils.checksum import sha256

FORMAT = "lmforge-index"
MANIFEST = "index.json"
PASSAGES = "passages.jsonl"
PARTS = ("bm25", "dense")  # each with a manifest.json of its own


class IndexDamaged(ValueError):
    """An index directory (or a part of it) that cannot be trusted: a file missing, cut, changed or from
    another build; the message names the file."""


def refuse_foreign_parts(out) -> None:
    """An UnsafePath (field "out") naming the first part folder of `out` (bm25/, dense/), which a build
    replaces whole, that holds anything but an index part's files (those its manifest.json lists, and
    itself): a user's folder of that name would go with its files."""
    from lmforge.utils.atomic import UnsafePath

    for name in PARTS:
        folder = Path(out) / name
        if not folder.is_dir() or folder.is_symlink():  # a link is replaced, never followed (replace_dir)
            continue
        try:
            listed = set(jsontext.loads((folder / "manifest.json").read_text(encoding="utf-8"))["sha256"])
        except (OSError, ValueError, KeyError, TypeError):
            listed = set()
        foreign = sorted(p.name for p in folder.iterdir() if p.name not in listed | {"manifest.json"})
        if foreign:
            raise UnsafePath(f"out {out}: {folder} holds {', '.join(foreign[:3])}"
                             f"{', ...' if len(foreign) > 3 else ''}, not an index part's files; a build "
                             f"replaces {name}/ whole: move them or choose another out", "out")


def start_build(out) -> None:
    """Remove out's index.json before its files are rewritten: a build cut short leaves no manifest, so
    the half-written index is refused, never read as whole."""
    (Path(out) / MANIFEST).unlink(missing_ok=True)


def finish_build(out, count: int, parts: tuple) -> Path:
    """Write out/index.json over the passages and the `parts` built (of PARTS)."""
    out = Path(out)
    parts = {name: sha256(out / name / "manifest.json") for name in parts}
    manifest = {"format": FORMAT, "version": 1, "count": count, "sha256": {PASSAGES: sha256(out / PASSAGES)},
                "parts": parts}
    return atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")


def open_index(path) -> tuple:
    """(passages, names of the parts built) of an index directory, passages.jsonl and each part's manifest
    checked against index.json; a missing or changed file is a one-line IndexDamaged naming it."""
    path = Path(path)
    manifest = _manifest(path)
    if sha256(path / PASSAGES) != manifest["sha256"].get(PASSAGES):
        raise IndexDamaged(f"{path / PASSAGES}: checksum does not match {MANIFEST} (damaged or changed since "
                           f"the index was built); build the index again")
    for name, want in manifest["parts"].items():
        file = path / name / "manifest.json"
        if name not in PARTS or not file.is_file() or sha256(file) != want:
            raise IndexDamaged(f"{file}: missing, or not the one {path / MANIFEST} was built with; build the "
                               f"index again")
    passages = read_passages(path / PASSAGES)
    if len(passages) != manifest["count"]:  # the checksum matched: a manifest edited by hand
        raise IndexDamaged(f"{path / PASSAGES}: {len(passages)} passages; {path / MANIFEST} says "
                           f"{manifest['count']}")
    return passages, set(manifest["parts"])


def read_manifest(file: Path, fmt: str, what: str) -> dict:
    """The manifest `file` of an index (or one of its parts): a JSON object of format `fmt` with a count
    of passages; an IndexDamaged naming the file, and what it should be (`what`), otherwise."""
    try:
        manifest = jsontext.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise IndexDamaged(f"{file}: missing or not JSON ({type(err).__name__}): built by an older lmforge, "
                           f"or its build was cut short; build the index again (lmforge index build)") \
            from None
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        raise IndexDamaged(f"{file}: not {what}")
    count = manifest.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise IndexDamaged(f"{file}: field 'count' missing or not a count")
    return manifest


def _manifest(path: Path) -> dict:
    """index.json, its fields of the expected kinds."""
    file = path / MANIFEST
    manifest = read_manifest(file, FORMAT, "an lmforge index manifest")
    for key in ("sha256", "parts"):
        if not isinstance(manifest.get(key), dict):
            raise IndexDamaged(f"{file}: field {key!r} missing or not an object")
    if not (path / PASSAGES).is_file():
        raise IndexDamaged(f"{path / PASSAGES}: missing")
    return manifest
