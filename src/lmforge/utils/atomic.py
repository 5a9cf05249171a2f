"""Files and folders written whole or not at all (a temporary one in the same folder, then a rename),
with the mode a plain open() (mkdir) would have given them, never through a symbolic link: a rename
replaces a link planted at the path (its target is untouched), and an append refuses one."""
from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from lmforge.utils.errors import OptionsError


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
    try:  # a link's target's mode is not the file's: a link is replaced, its target left alone
        mode = (os.stat(replacing).st_mode & 0o7777
                if replacing is not None and not os.path.islink(replacing) else None)
    except OSError:
        mode = None
    os.chmod(path, mode if mode is not None else (0o777 if directory else 0o666) & ~umask())


class UnsafePath(OptionsError):
    """An output path lmforge will not write: a symbolic link where it appends (it never writes through
    one), a folder where a file goes, or a path under a file (an OptionsError: lmforge.OptionsError catches
    every refusal of a request)."""


def writable_folder(path, what: str) -> Path:
    """`path` as a folder to write `what` (a model directory, a tokenizer's) into, or UnsafePath naming the
    field "path": an empty name (the working folder), a symbolic link (the files would go where it points)
    or a file; a path that is no text nor os.PathLike (None, a number, bytes) too."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(os.fspath(path), bytes):
        raise UnsafePath(f"path must be a folder's name (a str or a Path), got {type(path).__name__}", "path")
    if not str(path).strip():
        raise UnsafePath(f"path is empty: name the {what} to write (\"\" is the working folder)", "path")
    path = Path(path)
    if path.is_symlink():
        raise UnsafePath(f"path {path}: is a symbolic link; a {what} is never written through one (name the "
                         "folder it points to)", "path")
    if path.exists() and not path.is_dir():
        raise UnsafePath(f"path {path}: exists and is not a folder", "path")
    return path


def blocking_parent(path) -> str | None:
    """"P is a file, not a folder" (or "a symbolic link to nothing") for the nearest parent of `path` on
    disk where it is no folder (mkdir cannot pass either); None where the path's folders can be made."""
    for parent in Path(path).parents:
        if parent.exists() or parent.is_symlink():
            if parent.is_dir():
                return None
            what = "a file" if parent.exists() else "a symbolic link to nothing"
            return f"{parent} is {what}, not a folder"
    return None


def overlap(source: Path, target: Path) -> str | None:
    """How the resolved output `target` overlaps the resolved input `source`: "is" it, "holds" it, "lies
    inside" it (a folder), or None where they are apart (an output there would be read back, or written
    over the input)."""
    if source == target:
        return "is"
    if target in source.parents:
        return "holds"
    return "lies inside" if source.is_dir() and source in target.parents else None


# the kinds of file a model (or tokenizer) folder is read from, beside its config.json (not a report such as
# preds.jsonl a job writes there)
MODEL_FILES = (".json", ".safetensors", ".bin", ".pt", ".model", ".h5", ".hdf5", "vocab.txt", "merges.txt")


def writes_over(source: Path, target: Path, writes: tuple = (), model: Path | None = None,
                holding: bool = False) -> str | None:
    """How writing the output `target` (a file, or a folder the names `writes` go into) meets the input
    `source`, both resolved (links and ../ seen through): "is" it, or the same file or folder by another
    name (a hard link, a bind mount); "holds" it: a written name is it, holds it or is a hard link to it,
    or (holding: an input the output folder may not hold at all: the source model of prune's, quantize's,
    distill's and heads' --out, every input of a retrieval run) the output folder holds it; "lies inside"
    it: the output or a written name is a file the job reads from the input folder (a model folder: its
    files of MODEL_FILES' kinds in `model`, where they lie: utils.model_folder.inside_job_folder; any
    other folder: every file), by name, so that a rerun is judged as its first run; None where the input
    is left as it was, unread."""
    if source == target or _same(source, target):
        return "is"
    written = [target / name for name in writes]
    if any(path == source or path in source.parents or _same(source, path) for path in written) or \
            holding and target in source.parents:
        return "holds"
    read = [path for path in (target, *written) if source.is_dir() and source in path.parents]
    if any(model is None or path.parent == model and path.name.endswith(MODEL_FILES) for path in read):
        return "lies inside"
    return None


def _same(source: Path, path: Path) -> bool:
    """Whether two names on disk are one file or folder (a hard link, a bind mount); False where either is
    not there."""
    try:
        return identity(source) == identity(path)
    except OSError:
        return False


def identity(path) -> tuple:
    """A file's or folder's identity on disk, (st_dev, st_ino), as os.path.samefile compares them (a link
    followed): one for every name of one file; an OSError where it is not there."""
    found = os.stat(path)
    return found.st_dev, found.st_ino


def file_kind(path) -> str:
    """What `path` is, for an error that refuses it: "a regular file", "a folder", "a named pipe (FIFO)",
    "a socket", "a device", "a broken link" or "no such file" (a link is followed, as a reader's open is)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a broken link" if os.path.islink(path) else "no such file"
    except OSError as err:  # a folder on the way not ours to read: the reader would fail the same way
        return f"not readable ({err.strerror})"
    kinds = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"),
             (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))
    return next((said for test, said in kinds if test(mode)), "a device")


def check_file_path(path) -> Path:
    """`path` as a place a file can be written: not a folder, no file where a parent folder must be."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise UnsafePath(f"{path}: is a folder, not a file")
    if (blocked := blocking_parent(path)) is not None:
        raise UnsafePath(f"{path}: {blocked}")
    return path


@contextmanager
def naming(path):
    """An OSError while making room for `path` (its folders, a temporary name beside it) names `path`,
    the output asked for, not the temporary name or a folder on the way."""
    try:
        yield
    except OSError as err:
        if err.errno is None or err.filename is None or err.filename == str(path):
            raise
        if os.path.basename(err.filename).startswith(f".{Path(path).name}."):  # the temporary name
            raise OSError(err.errno, err.strerror, str(path)) from None
        raise OSError(err.errno, f"{err.strerror} (writing {path})", err.filename) from None


def atomic_write(path, write: Callable[[BinaryIO], object]) -> Path:
    """Call write(handle) on a temporary binary file in `path`'s folder, then rename it over `path`
    (a link there is replaced, never followed); on any failure the temporary file goes and `path`
    is as it was."""
    path = check_file_path(path)
    with naming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        as_created(tmp, replacing=path)
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno is not None and not err.filename:
            err.filename = str(path)  # a write into the handle (a full disk) names no file: the one asked
        raise
    return path


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write bytes to a temporary file in the same folder, then rename over `path`."""
    return atomic_write(path, lambda handle: handle.write(data))


def atomic_write_text(path, text: str) -> Path:
    """Write text (UTF-8) to a temporary file in the same folder, then rename over `path`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def fsync_dir(path) -> None:
    """Flush the folder `path`'s entries to disk, so that a rename into it outlives a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_savefig(fig, path, dpi: float | None = None, fmt: str | None = None) -> Path:
    """Save a matplotlib figure atomically (savefig into a temporary file, then a rename); the
    format from `fmt` or the file's suffix (savefig cannot see a name through a handle)."""
    import matplotlib

    fmt = fmt or Path(path).suffix.lstrip(".").lower() or "png"
    # the same figure, the same bytes: no date stamped into svg or pdf, and svg's element ids from a fixed
    # salt rather than a random one (png holds no date; ps would need SOURCE_DATE_EPOCH, which lmforge
    # does not set for a caller's process)
    metadata = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(fmt)
    with matplotlib.rc_context({"svg.hashsalt": "lmforge"}):
        return atomic_write(path, lambda handle: fig.savefig(handle, format=fmt, dpi=dpi, metadata=metadata))


def refuse_link(path) -> Path:
    """`path`, or UnsafePath naming it where it is a symbolic link (lmforge never writes through one)."""
    path = Path(path)
    if path.is_symlink():
        raise UnsafePath(f"{path}: is a symbolic link; refusing to write through it (remove it or choose "
                         f"another output folder)")
    return path


def append_text(path, text: str) -> None:
    """Append text to `path` (created if missing) without following a link there: O_NOFOLLOW, and a
    link is UnsafePath naming the file. An append of one line is written whole (one write call)."""
    path = refuse_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:  # planted between the check and the open
            refuse_link(path)
        raise
    with os.fdopen(fd, "ab") as handle:
        handle.write(text.encode("utf-8"))


def replace_dir(dest, write: Callable[[Path], object]) -> bool:
    """Call write(folder) on a fresh folder beside `dest`, then put it in the place of `dest` whole:
    the old `dest` (a link: the link, not what it points to) is moved aside first and removed only
    once the new one is in place. Returns whether a `dest` was there; on a failure the fresh folder
    goes and `dest` is as it was. What a killed earlier call left beside `dest` is tidied first."""
    dest = Path(dest)
    with naming(dest):
        dest.parent.mkdir(parents=True, exist_ok=True)
        _tidy(dest)
        staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.new-{os.getpid()}-"))
    existed = dest.exists() or dest.is_symlink()
    old = dest.with_name(f".{dest.name}.old-{staging.name.split('.new-', 1)[1]}")
    try:
        as_created(staging, directory=True)  # mkdtemp makes it 0700 whatever the umask
        with as_asked(staging, dest):
            write(staging)
        if existed:
            os.replace(dest, old)  # a rename: nothing of the old folder is lost if the next one fails
        try:
            os.replace(staging, dest)
        except BaseException:
            if existed:
                os.replace(old, dest)
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    remove_path(old)
    return existed


@contextmanager
def as_asked(staging: Path, dest: Path):
    """An OSError raised while a fresh folder `staging` is written in place of `dest` names `dest`, where
    its file names or message name `staging` (a full disk while saving a model: dest/model.safetensors,
    not the fresh folder's temporary name)."""
    try:
        yield
    except OSError as err:
        for attr in ("filename", "filename2", "strerror", "path"):  # DiskFull keeps its file in .path too
            value = getattr(err, attr, None)
            if isinstance(value, (str, os.PathLike)) and str(staging) in str(value):
                setattr(err, attr, str(value).replace(str(staging), str(dest)))
        raise


def replace_files(dest, write: Callable[[Path], object]) -> list:
    """Call write(folder) on a fresh folder beside `dest`, then rename each file it made into `dest`, whose
    other files stay: a failure while writing (a full disk) leaves `dest` as it was, never some of the
    files new and the rest old or missing, since the renames that follow need no space. `dest` may not be
    a symbolic link (UnsafePath); write makes files only. Returns the names put in place."""
    dest = refuse_link(dest)
    with naming(dest):
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.files-"))
    try:
        with as_asked(staging, dest):
            write(staging)
        names = sorted(p.name for p in staging.iterdir())
        with naming(dest):
            dest.mkdir(exist_ok=True)
        for name in names:
            os.replace(staging / name, dest / name)  # a link at the name is replaced, never followed
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return names


def _tidy(dest: Path) -> None:
    """Remove the fresh and set-aside folders of replace_dir calls whose process is gone (killed
    mid-write); where one was killed between its two renames, its set-aside `dest` is put back first."""
    for old in sorted(dest.parent.glob(f".{dest.name}.old-*")):
        if not _alive(old.name.split(".old-", 1)[1]):
            if not (dest.exists() or dest.is_symlink()):
                os.replace(old, dest)  # the state before the killed call: its new folder is dropped below
            else:
                remove_path(old)
    for staging in sorted(dest.parent.glob(f".{dest.name}.new-*")):
        if not _alive(staging.name.split(".new-", 1)[1]):
            remove_path(staging)


def _alive(tag: str) -> bool:
    """Whether the process whose id starts `tag` ("<pid>-<random>") still runs; a tag without an id
    (a folder from before ids were written) is taken as gone."""
    try:
        pid = int(tag.split("-", 1)[0])
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's process: alive
        return True
    return pid != 0


def remove_path(path: Path) -> None:
    """Remove a folder (a link: the link, not what it points to; a file) if there; errors ignored."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
