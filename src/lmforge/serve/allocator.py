"""Which C allocator the server's process runs on: jemalloc where it is installed, else tcmalloc, else
glibc's malloc with its heap bounded (worker.bound_heap).

Why: a server's batches have a new shape almost every time. glibc either keeps every freed tensor
block in a heap that fragments (resident memory +75 % over 20,000 requests, measured) or, with its
mmap threshold fixed, maps and unmaps each one, paying page faults and TLB shootdowns at every
forward pass: ~18 % of the encode throughput. A pooling allocator keeps freed blocks for reuse, as
PyTorch's CPU tuning guide recommends. Measured (all-MiniLM-L6-v2, 2 cores, 64 clients, the server
over 100,000 requests after a 2,000-request warm-up, bench/serve_load.py): with two workers tcmalloc
(gperftools; Debian libtcmalloc-minimal4) grew 462 -> 502 MiB (8.6 %: its page heap keeps the
high-water mark of the two workers' transient batches, which rises in steps as rarer large batches
meet); jemalloc (Debian libjemalloc2) with its background purging thread (MALLOC_CONF
background_thread:true, set unless the user sets MALLOC_CONF) 438 -> 440 MiB (0.3 %, peak 449): it
returns dirty pages after ~10 s of disuse, so a rare large batch costs memory only while it lasts.
glibc bounded: 0.762x offline throughput. An allocator the user preloads (mimalloc, ...) is left in
place.

An allocator is chosen when a process starts (LD_PRELOAD), so the server starts itself again,
execve with the same arguments and process id, once its arguments are checked.
"""
from __future__ import annotations

import os
import sys

from lmforge.utils.malloc import named_in, preloaded

LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
LIBRARIES = {"jemalloc": tuple(f"{d}/libjemalloc.so.2" for d in LIBRARY_DIRS),  # auto's order of preference
             "tcmalloc": tuple(f"{d}/libtcmalloc_minimal.so.4" for d in LIBRARY_DIRS)}
PACKAGES = {"jemalloc": "libjemalloc2", "tcmalloc": "libtcmalloc-minimal4"}  # Debian's
CHOICES = ("auto", *LIBRARIES, "glibc")
MARK = "LMFORGE_SERVE_MALLOC"  # set in the restarted process: it never restarts again
JEMALLOC_CONF = "background_thread:true"  # purge unused pages on jemalloc's own thread, not in a batch


def find(name: str, libraries: dict = LIBRARIES):
    """The path of the installed library of allocator `name` ("jemalloc", "tcmalloc"), or None."""
    return next((path for path in libraries.get(name, ()) if os.path.isfile(path)), None)


def chosen(choice: str = "auto", libraries: dict = LIBRARIES):
    """The allocator --malloc `choice` runs on where nothing is preloaded: auto's first installed one
    (jemalloc, tcmalloc), else "glibc"."""
    if choice != "auto":
        return choice
    return next((name for name in libraries if find(name, libraries)), "glibc")


def active(choice: str = "auto") -> str:
    """The preloaded allocator this process has mapped ("jemalloc", "tcmalloc", ...), else "glibc"; a
    ValueError where `choice` (--malloc) names one that is not loaded (main() called in-process, a bad
    preload)."""
    found = preloaded() or "glibc"
    if choice in LIBRARIES and found != choice:
        raise ValueError(f"--malloc {choice}: the library is not loaded in this process (LD_PRELOAD="
                         f"{os.environ.get('LD_PRELOAD', '')!r}; start it with the `lmforge` command)")
    return found


def restart_environment(choice: str, environ: dict, libraries: dict = LIBRARIES):
    """The environment to start the server again with for `choice`, or None to go on as it is; a
    ValueError naming --malloc and the package where an allocator asked for is missing."""
    if choice not in CHOICES:
        raise ValueError(f"--malloc {choice!r}: expected one of {', '.join(CHOICES)}")
    preload = environ.get("LD_PRELOAD", "")
    loaded = named_in(preload)
    if environ.get(MARK) or choice in loaded or (choice == "auto" and loaded):
        return None  # restarted already, or an allocator the user preloads stands
    name, path = chosen(choice, libraries), None
    if name == "glibc" and not loaded:
        return None  # on glibc already
    if name != "glibc" and (path := find(name, libraries)) is None:
        if choice != "auto":
            raise ValueError(f"--malloc {choice}: no {choice} library found "
                             f"(Debian package {PACKAGES[choice]})")
        return None
    # an allocator the user preloads would be shadowed by ours, or shadow glibc's, and be the one
    # preloaded() names: an explicit --malloc drops it
    rest = [p for p in preload.replace(" ", ":").split(":") if p and not named_in(p)]
    out = {k: v for k, v in environ.items() if k != "LD_PRELOAD"} | {MARK: choice}
    if path or rest:
        out["LD_PRELOAD"] = ":".join([path, *rest] if path else rest)
    if name == "jemalloc" and "MALLOC_CONF" not in environ:
        out["MALLOC_CONF"] = JEMALLOC_CONF
    return out


def restart(environment: dict) -> None:
    """Start this command again (execve: the same arguments and process id) with `environment`
    (restart_environment's); returns only where it cannot (no sys.orig_argv or executable)."""
    argv = getattr(sys, "orig_argv", None)
    if not argv or not sys.executable:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, environment)
