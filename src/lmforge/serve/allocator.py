"""Which C allocator the server's process runs on: tcmalloc where it is installed, else glibc's malloc
with its heap bounded (worker.bound_heap).

Why: a server's batches have a new shape almost every time. glibc either keeps every freed tensor
block in a heap that fragments (resident memory +75 % over 20,000 requests, measured) or, with its
mmap threshold fixed, maps and unmaps each one, paying page faults and TLB shootdowns at every
forward pass: ~18 % of the encode throughput. tcmalloc (gperftools; Debian: libtcmalloc-minimal4)
keeps freed spans by size class for reuse, as PyTorch's CPU tuning guide recommends. Measured
(all-MiniLM-L6-v2, 2 threads, in-process batches of 1-64 texts): glibc bounded 84.8 texts/s
(system time 38.5 s over 300 batches), tcmalloc 102.1 (3.4 s); over 1,500 batches tcmalloc's
resident size 548 MiB after the first 100 and 571 at the end; the server over 100,000 requests
528 -> 550 MiB after its warm-up (4.03 %), at 0.879x offline throughput against glibc's 0.762x.
An allocator the user preloads (jemalloc, mimalloc) is left in place.

An allocator is chosen when a process starts (LD_PRELOAD), so the server starts itself again,
execve with the same arguments and process id, once its arguments are checked.
"""
from __future__ import annotations

import os
import sys

from lmforge.fast.malloc import POOLING, preloaded

LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
TCMALLOC = tuple(f"{d}/libtcmalloc_minimal.so.4" for d in LIBRARY_DIRS)
CHOICES = ("auto", "tcmalloc", "glibc")
MARK = "LMFORGE_SERVE_MALLOC"  # set in the restarted process: it never restarts again
PACKAGE = "libtcmalloc-minimal4"
OTHER_ALLOCATORS = tuple(a for a in POOLING if a != "tcmalloc")  # preloaded: --malloc auto leaves them


def find_tcmalloc(candidates: tuple = TCMALLOC):
    """The path of an installed tcmalloc library, or None."""
    return next((path for path in candidates if os.path.isfile(path)), None)


def active(choice: str = "auto") -> str:
    """The preloaded allocator this process has mapped ("tcmalloc", "jemalloc", ...), else "glibc"; a
    ValueError where `choice` (--malloc) is "tcmalloc" and it is not loaded (main() called in-process,
    a bad preload)."""
    found = preloaded() or "glibc"
    if choice == "tcmalloc" and found != "tcmalloc":
        raise ValueError(f"--malloc tcmalloc: the library is not loaded in this process (LD_PRELOAD="
                         f"{os.environ.get('LD_PRELOAD', '')!r}; start it with the `lmforge` command)")
    return found


def restart_environment(choice: str, environ: dict, candidates: tuple = TCMALLOC):
    """The environment to start the server again with for `choice`, or None to go on as it is; a
    ValueError naming --malloc and the package where tcmalloc is asked for and missing."""
    if choice not in CHOICES:
        raise ValueError(f"--malloc {choice!r}: expected one of {', '.join(CHOICES)}")
    preload = environ.get("LD_PRELOAD", "")
    if choice == "glibc" or environ.get(MARK) or "libtcmalloc" in preload:
        return None
    if choice == "auto" and any(name in preload for name in OTHER_ALLOCATORS):
        return None  # the user preloads an allocator of their own: it stands
    path = find_tcmalloc(candidates)
    if path is None:
        if choice == "tcmalloc":
            raise ValueError(f"--malloc tcmalloc: no tcmalloc library found (Debian package {PACKAGE})")
        return None
    return {**environ, "LD_PRELOAD": f"{path}:{preload}" if preload else path, MARK: choice}


def restart(environment: dict) -> None:
    """Start this command again (execve: the same arguments and process id) with `environment`
    (restart_environment's); returns only where it cannot (no sys.orig_argv or executable)."""
    argv = getattr(sys, "orig_argv", None)
    if not argv or not sys.executable:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, environment)
