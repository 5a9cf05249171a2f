"""OUT/results.jsonl: one JSON line per finished unit of a plan (arm x seed x task), each row carrying
a checksum of its own content, so a result is verified on every read and resume is exact.

A row whose checksum does not match its content (a value edited since it was written), and any line
that is not a row, is a ResultsError naming file:line: never skipped (its unit would be trained again
on every rerun) and never believed (a report built on an edited number). The one damage tolerated is
a torn last line (no newline at its end, not JSON: a process killed mid-append): a reader leaves it
out with a warning, and a run cuts it from the file with a warning and runs its unit again. A row
without a checksum (written before rows carried one, or by hand) is read as it is with a warning, and
kept so: a rewrite of the file never gives a row a checksum it was not written with.
"""
from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

from lmforge.bakeoff.layout import BUILT, RESULTS
from lmforge.utils.atomic import append_text, atomic_write_bytes, atomic_write_text
from lmforge.utils.checksum import sha256, sign, verify

CHECKSUM = "checksum"
KEYS = {"arm": str, "seed": int, "task": str, "metric": str, "value": (int, float)}  # what a reader relies on


class ResultsError(ValueError):
    """A results file that cannot be trusted: the message names file:line."""


class ResultsWarning(UserWarning):
    """A results file read with a caveat: a torn last line left out or cut, rows without a checksum."""


def stamped(row: dict) -> dict:
    """The row as JSON writes it (tuples as lists ...), with the checksum of that content (an older one
    replaced)."""
    return sign(row, CHECKSUM)


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        return False
    return True


def _torn_tail(data: bytes) -> int | None:
    """Where a torn last line starts (after the last newline), or None: the file ends on a newline,
    or its last line is whole JSON that only lacks the newline (a row added by hand)."""
    start = data.rfind(b"\n") + 1
    tail = data[start:]
    return start if tail.strip() and not _parses(tail) else None


def _row(path: Path, number: int, line: bytes) -> dict:
    """Line `number` of `path` as a verified row; ResultsError naming file:line if it is not one."""
    where = f"{path}:{number}"
    try:
        row = json.loads(line)
    except ValueError:
        raise ResultsError(f"{where}: not a JSON row (a damaged line; delete it to run its unit again)") \
            from None
    if not isinstance(row, dict):
        raise ResultsError(f"{where}: not a result row (a JSON object), a {type(row).__name__}")
    wrong = [k for k, kind in KEYS.items()
             if not isinstance(row.get(k), kind) or isinstance(row.get(k), bool)]
    if wrong:
        raise ResultsError(f"{where}: not a result row: {', '.join(wrong)} missing or of the wrong type")
    # optional: a row without one is read unverified, and read_results warns of it
    return verify(row, CHECKSUM, where, error=ResultsError, optional=True,
                  what="the row does not match its checksum (changed since it was written); delete the line "
                       "to run its unit again")


def read_results(out) -> list:
    """The verified rows of OUT/results.jsonl ([] if none): ResultsError naming file:line for a line that is
    not a row or does not match its checksum; a torn last line left out with a warning (never written)."""
    path = Path(out) / RESULTS
    if not path.is_file():
        return []
    data = path.read_bytes()
    torn = _torn_tail(data)
    if torn is not None:
        warnings.warn(f"{path}: its last line is torn (a write cut short): left out; a rerun runs its unit "
                      "again", ResultsWarning, stacklevel=2)
        data = data[:torn]
    rows = _rows(path, data)
    unsigned = sum(CHECKSUM not in row for row in rows)
    if unsigned:
        warnings.warn(f"{path}: {unsigned} row(s) without a checksum (written before rows carried one, or by "
                      f"hand): read unverified", ResultsWarning, stacklevel=2)
    return rows


def _rows(path: Path, data: bytes) -> list:
    """The verified rows of the file's bytes, one a unit: a second row of a unit (arm, seed, task) is a
    ResultsError naming both lines (a run replaces a unit's row, so two mean a hand or a second writer, and
    a report would count the unit twice)."""
    rows, seen = [], {}
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        row = _row(path, number, line)
        unit = (row["arm"], row["seed"], row["task"])
        if unit in seen:
            raise ResultsError(f"{path}:{number}: a second row of arm {unit[0]}, seed {unit[1]}, "
                               f"task {unit[2]} (line {seen[unit]} is the first); delete one of them")
        seen[unit] = number
        rows.append(row)
    return rows


def mend(out) -> None:
    """Make OUT/results.jsonl end on a fresh line: a torn last line cut (with a warning naming the file,
    its unit then runs again), a whole last row without its newline given one."""
    path = Path(out) / RESULTS
    if not path.is_file():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    torn = _torn_tail(data)
    if torn is None:
        append_text(path, "\n")
        return
    warnings.warn(f"{path}: its last line was torn (a write cut short): cut from the file; its unit runs "
                  "again", ResultsWarning, stacklevel=2)
    atomic_write_bytes(path, data[:torn])  # whole or not at all: a second kill leaves the torn file as it was


def append_row(out, row: dict) -> dict:
    """Add a row (with its checksum) to OUT/results.jsonl, on a line of its own; returns the row written."""
    row = stamped(row)
    mend(out)  # never onto a torn line: the two would be one unreadable line
    append_text(Path(out) / RESULTS, json.dumps(row) + "\n")
    return row


def replace_row(out, row: dict) -> dict:
    """Rewrite OUT/results.jsonl with `row` (with its checksum) in place of the rows of its unit (arm, seed,
    task); the other rows as they were read. Returns the row written."""
    row, unit = stamped(row), (row["arm"], row["seed"], row["task"])
    rows = [r for r in read_results(out) if (r["arm"], r["seed"], r["task"]) != unit] + [row]
    atomic_write_text(Path(out) / RESULTS, "".join(json.dumps(r) + "\n" for r in rows))
    return row


def write_signed(path: Path, data: dict) -> None:
    """Write a JSON object the run builds once and reads again (a task's splits) with its checksum."""
    atomic_write_text(path, json.dumps(stamped(data)) + "\n")


def read_signed(path: Path) -> dict:
    """The object write_signed wrote, verified (one written before it carried a checksum is read as it is):
    not JSON or changed since is a ResultsError naming the file, never data trained on unsaid."""
    damaged = "damaged or changed since it was written; delete it to build it again"
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # not UTF-8 or not JSON
        raise ResultsError(f"{path}: not JSON ({err}): {damaged}") from None
    value = verify(value, CHECKSUM, path, error=ResultsError, optional=True,
                   what=f"not what was written (its checksum does not match): {damaged}")
    return {k: v for k, v in value.items() if k != CHECKSUM}


# a file changed this recently may change again within one tick of its clock, its stat unchanged: hashed
# afresh at each use (git's "racy" files); 2 s covers the coarsest mtimes (FAT's)
RECENT_NS = 2 * 10 ** 9
_HASHED: dict = {}  # (path, device, inode, size, mtime, ctime) -> sha256, for this process


def file_sha256(path) -> str:
    """sha256 of a file, read once a process while its stat stays as it was (inode, size, mtime, ctime):
    every use of a corpus checks its files, and a run uses each many times (start, each arm, each seed)."""
    before = os.stat(path)
    key = (os.path.abspath(path), before.st_dev, before.st_ino, before.st_size, before.st_mtime_ns,
           before.st_ctime_ns)
    if key in _HASHED:
        return _HASHED[key]
    digest = sha256(path)
    after = os.stat(path)
    # kept only if the file stood still while it was read and since a while before: by its ctime, which
    # the kernel sets at every change (an mtime can be set back: cp -p, rsync -t, a restore)
    if (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == key[3:] and \
            time.time_ns() - max(after.st_mtime_ns, after.st_ctime_ns) > RECENT_NS:
        _HASHED[key] = digest
    return digest


def built_record(out: Path) -> dict:
    """OUT/built.json's object, verified ({} if there is none)."""
    return read_signed(out / BUILT) if (out / BUILT).is_file() else {}


def held_to_record(out, files: dict, error: type, since: str, remedy: str, section: str | None = None
                   ) -> None:
    """Each of `files` (its key in OUT/built.json -> its path) checked against the checksum the record keeps
    under its key (in its `section`, or at its top): one that differs is `error` naming it ("PATH: changed
    SINCE (its checksum in OUT/built.json differs)REMEDY"); those not kept yet are recorded (a first use)."""
    out = Path(out)
    record = built_record(out)
    kept = record.get(section, {}) if section else record
    seen = {}
    for key, path in files.items():
        seen[key] = file_sha256(path)
        if kept.get(key, seen[key]) != seen[key]:
            raise error(f"{path}: changed {since} (its checksum in {out / BUILT} differs){remedy}")
    new = {key: digest for key, digest in seen.items() if key not in kept}
    if new:
        write_signed(out / BUILT, {**record, section: {**kept, **new}} if section else {**record, **new})


def built_files(out, paths: list, build=None) -> None:
    """Files the plan builds once under OUT and reads on every rerun (its corpus): where they are there,
    each is checked against the checksum OUT/built.json keeps of it (a ResultsError naming it; one not kept
    yet is recorded); else `build()` makes them and their checksums are recorded."""
    out, paths = Path(out), [Path(p) for p in paths]
    keys = {p.relative_to(out).as_posix(): p for p in paths}
    if all(p.is_file() for p in paths):
        held_to_record(out, keys, ResultsError, "or damaged since the plan built it",
                       "; delete it to build it again")
        return
    if build is not None:
        build()
    made = {key: file_sha256(p) for key, p in keys.items() if p.is_file()}  # a rebuilt file: its new sum
    write_signed(out / BUILT, {**built_record(out), **made})


def hardware(device: str = "auto") -> str:
    """What a TrainConfig `device` runs on here, in words (a result row and the report name it): the GPU's
    name or the CPU's model and threads, and torch's version."""
    import platform

    import torch

    from lmforge.quant.isa import cpu_fields
    from lmforge.train.loop import resolve_device

    found = resolve_device(device)
    if found.type == "cuda":
        name = f"{torch.cuda.get_device_name(found)} (cuda)"
    elif found.type == "cpu":
        name = f"{cpu_fields()['model name'] or platform.machine()} (cpu, {torch.get_num_threads()} threads)"
    else:
        name = found.type
    return f"{name}, torch {torch.__version__}"
