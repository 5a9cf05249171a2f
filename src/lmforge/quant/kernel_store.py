"""The int8 kernel choices of this machine (and fast/route.py's fp32 output routes), kept in a file: a
model gives the same outputs in every process.

quant/int8.py times the kernels of each (mode, in, out, rows, threads) the first time it meets it
and runs the fastest. Kernels do not round alike (the fp32 product against an int8 one; fbgemm's
activation quantisation against oneDNN's), so two processes that chose differently gave different
outputs from one checkpoint: all-MiniLM-L6-v2 int8 embeddings of the same texts were up to ~4e-3
apart in 3 of 6 runs (measured). Here a choice is measured once per machine (CPU, its flags, the
ISA caps in the environment, the torch version) and written down; every later process reads it.
quant/int8.stored names a choice with the kernels lmforge offered when it was made, so a kernel added
later is timed, not shut out by an older choice.

The file is $LMFORGE_INT8_KERNELS (int8_kernels.json inside it where it names a folder), else
$XDG_CACHE_HOME/lmforge/int8_kernels.json (~/.cache by default). Delete it to measure again;
LMFORGE_INT8_KERNELS=off keeps choices per process only. A file that cannot be read or written is
said once, in one line on standard error, and the process goes on measuring for itself. A choice
measured while other work took over a quarter of the process's CPUs (timing.Elsewhere: other
processes, a virtual machine's steal time) is not written down either: it was made for that load.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
from pathlib import Path

from lmforge.quant.isa import machine
from lmforge.utils.atomic import atomic_write_text
from lmforge.utils.timing import Elsewhere, alternating

ENV = "LMFORGE_INT8_KERNELS"
NAME = "int8_kernels.json"
_WARNED: set = set()  # files already warned about in this process


def cached_place(env: str, default: str) -> Path | None:
    """Where lmforge keeps what it learned about this machine (kernel choices, built native code): the
    path in $env (`off`: None, nowhere), else `default` under $XDG_CACHE_HOME/lmforge (~/.cache)."""
    where = os.environ.get(env, "").strip()
    if where.lower() == "off":
        return None
    if where:
        return Path(where)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lmforge" / default


def store_path() -> Path | None:
    """The file choices are kept in, or None where LMFORGE_INT8_KERNELS=off."""
    path = cached_place(ENV, NAME)
    return path / NAME if path is not None and path.is_dir() else path


def _name(key: tuple) -> str:
    return "|".join(str(part) for part in key)


def _read(path: Path) -> dict:
    """The file's {machine: {choice key: kernel}}; empty where it is missing, and where unreadable
    (said once: it is written anew)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and all(isinstance(v, dict) for v in data.values()):
            return data
        raise ValueError("not a mapping of machines to choices")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:  # nested past the parser: too
        _say_once(path, f"int8 kernel choices unreadable ({err}); measuring again")
        return {}


def chosen(table: dict, lock, key: tuple, choose) -> str:
    """table[key], made by choose() at the key's first call in this process, one at a time under `lock`
    (threads meeting a new key together, a server's workers, wait for one choice)."""
    value = table.get(key)
    if value is None:
        with lock:
            value = table.get(key)  # another thread's choice, made while this one waited
            if value is None:
                value = table[key] = choose()
    return value


def report(table: dict, timings: dict, fields: tuple, name: str) -> list:
    """Each of this process's choices as a dict: its key under `fields`, the choice under `name`, and the
    times it was made on ("ms"), or for a choice read back, the file it came from."""
    kept = {"kept_in": str(store_path())}
    return [{**dict(zip(fields, key)), name: value,
             **({"ms": {n: round(s * 1e3, 4) for n, s in timings[key].items()}} if key in timings else kept)}
            for key, value in table.items()]


def recall(key: tuple) -> str | None:
    """The kernel this machine chose for `key` before, or None (also for an entry that names no kernel: a
    hand-edited file's list or number is measured again, not run)."""
    path = store_path()
    known = None if path is None else _read(path).get(machine(), {}).get(_name(key))
    return known if isinstance(known, str) else None


def settle(key: tuple, measured: str, stale: str | None = None, elsewhere=None) -> str:
    """Write `measured` down for `key` unless another process did first (a written `stale` kernel, one
    this torch cannot run, is replaced); returns the kernel to run, the one written down. Where the
    file cannot be written, `measured`, said once. elsewhere: the measurement's timing.Elsewhere; a
    busy one is this process's choice only (said once), the next process measures again."""
    path = store_path()
    if path is None:
        return measured
    if elsewhere is not None and elsewhere.busy:
        _say_once(path, f"kernel choice {_name(key)} measured while {elsewhere.share:.0%} of the CPUs' "
                        "time went to other work: used in this process, not kept")
        return measured
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _lock_file(path) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # read, add, write: no other process's choice lost
            data = _read(path)
            mine = data.setdefault(machine(), {})
            written = mine.get(_name(key))
            if written is not None and (written == stale or not isinstance(written, str)):
                del mine[_name(key)]  # replaced: a kernel this torch cannot run, or no kernel's name
            kernel = mine.setdefault(_name(key), measured)
            if kernel == measured:
                atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
            return kernel
    except OSError as err:
        _say_once(path, f"int8 kernel choices not kept ({err.strerror or err}); set {ENV}=off or a "
                        "writable file")
        return measured


def settle_fastest(key: tuple, calls: dict, rounds: int, stale: str | None = None) -> tuple:
    """(the fastest of calls (name -> call) over alternating rounds, each its fastest round so that a burst
    of load from elsewhere does not decide, written down for `key` as `settle` does; {name: seconds})."""
    with Elsewhere() as elsewhere:
        times = alternating(calls, rounds=rounds, pick=min)
    return settle(key, min(times, key=times.get), stale=stale, elsewhere=elsewhere), times


def _lock_file(path: Path):
    """The store's `.lock` beside it, opened (created if missing) without following a link there: a link
    planted at its path is an OSError (the choice is this process's), never a file made at its target."""
    lock = path.with_name(path.name + ".lock")
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(lock, flags, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise OSError(err.errno, f"{lock} is a symbolic link; not followed") from None
        raise
    return os.fdopen(fd, "r+b")


def _say_once(path: Path, message: str) -> None:
    """One line on standard error per file and process (a warning's two lines would break a command's
    one-line output rule)."""
    if path not in _WARNED:
        _WARNED.add(path)
        print(f"lmforge: {path}: {message}", file=sys.stderr)
