"""Files written whole or not at all (a temporary file in the same folder, then a rename), with the
mode a plain open() would have given them."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def umask() -> int:
    """The process's file-creation mask, read without changing it (os.umask can only read by setting,
    which would race with other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):  # not Linux, or a kernel before 4.7
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def as_created(path, directory: bool = False, replacing=None) -> None:
    """Give a file (folder) made by tempfile the mode open() (mkdir) would have: mkstemp makes it
    0600 and mkdtemp 0700 whatever the umask, so a renamed model would be readable by its owner only.
    `replacing`: the file it will be renamed over, whose mode it keeps where it exists (as open() does)."""
    try:
        mode = os.stat(replacing).st_mode & 0o7777 if replacing is not None else None
    except OSError:
        mode = None
    os.chmod(path, mode if mode is not None else (0o777 if directory else 0o666) & ~umask())


def atomic_write_text(path: Path, text: str) -> None:
    """Write text to a temporary file in the same folder, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        as_created(tmp, replacing=path)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
