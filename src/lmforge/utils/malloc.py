"""Which C allocator this process runs on: one that pools freed blocks itself, preloaded, or glibc's.

Read from the process's mappings, so it names what is loaded, whatever asked for it. quant/scratch.py
leaves its scratch buffers off under a pooling allocator; serve/allocator.py reports and checks it.
"""
from __future__ import annotations

POOLING = ("tcmalloc", "jemalloc", "mimalloc", "hoard")  # allocators that keep freed blocks for reuse


def named_in(text: str) -> list:
    """The pooling allocators a text (a process's maps, an LD_PRELOAD) names, in POOLING's order."""
    return [name for name in POOLING if f"lib{name}" in text]


def preloaded() -> str | None:
    """The pooling allocator mapped into this process ("tcmalloc", "jemalloc", ...), or None (glibc)."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            maps = f.read()
    except OSError:
        return None
    return next(iter(named_in(maps)), None)
