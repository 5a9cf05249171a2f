"""Writing a compressed model to OUT/model (quantize, prune): whole or not at all, and never mixed with
an older model there.

The model is written into a fresh folder beside OUT/model that then replaces OUT/model as a whole, so
no file of an earlier model (nor anything a user put in that folder) is left mixed in with the new one,
a failure leaves no half model, and nothing outside OUT/model is removed. Files carried over from the
source (task.json, a sentence-transformers directory's own files) are copied by content and get the
mode a newly created file has under the umask, not the source's (a 0600 source stays private only
where the umask says so).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from lmforge.atomic import as_created

SENTENCE_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def copy_as_created(source: Path, dest: Path) -> None:
    """Copy a file, or a folder and everything in it, by content: each copy with the mode a file (folder)
    created now would have, not the source's."""
    if source.is_dir():
        dest.mkdir()
        as_created(dest, directory=True)
        for item in sorted(source.iterdir()):
            copy_as_created(item, dest / item.name)
    else:
        shutil.copyfile(source, dest)
        as_created(dest)


def carry_sentence_files(source: Path, dest: Path) -> None:
    """Copy a sentence-transformers directory's own files (modules, pooling, max_seq_length), so the
    compressed model embeds as the original does."""
    for name in SENTENCE_FILES:
        if (source / name).is_file():
            copy_as_created(source / name, dest / name)
    for folder in source.glob("[0-9]_*"):
        if folder.is_dir() and not (dest / folder.name).exists():
            copy_as_created(folder, dest / folder.name)


def replace_model_dir(dest: Path, write: Callable[[Path], object]) -> bool:
    """Call write(folder) on a fresh folder beside `dest`, then put it in the place of `dest` whole:
    the old `dest` (a link: the link, not what it points to) is moved aside first and removed only
    once the new one is in place. Returns whether a `dest` was there; on a failure the fresh folder
    goes and `dest` is as it was."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.new-"))
    existed = dest.exists() or dest.is_symlink()
    old = dest.with_name(f".{dest.name}.old-{staging.name.rsplit('-', 1)[-1]}")
    try:
        as_created(staging, directory=True)  # mkdtemp makes it 0700 whatever the umask
        write(staging)
        if existed:
            os.replace(dest, old)  # a rename: nothing of the old model is lost if the next one fails
        try:
            os.replace(staging, dest)
        except BaseException:
            if existed:
                os.replace(old, dest)
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    elif existed:
        old.unlink(missing_ok=True)
    return existed


def replaced_line(dest: Path) -> str:
    """The line a command prints after replacing an existing model folder."""
    return f"{dest} existed: replaced as a whole by the new model (nothing of the old folder kept)"
