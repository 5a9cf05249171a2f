"""Writing a compressed model to OUT/model (quantize, prune): whole or not at all, and never mixed with
an older model there.

The model is written into a fresh folder beside OUT/model that then replaces OUT/model as a whole
(lmforge/atomic.replace_dir), so no file of an earlier model (nor anything a user put in that folder)
is left mixed in with the new one, a failure leaves no half model, and nothing outside OUT/model is
removed. Files carried over from the
source (task.json, a sentence-transformers directory's own files) are copied by content and get the
mode a newly created file has under the umask, not the source's (a 0600 source stays private only
where the umask says so).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from lmforge.utils.apart import refuse_writing_over
from lmforge.utils.atomic import UnsafePath, as_created, blocking_parent, refuse_link

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


def replaced_line(dest: Path) -> str:
    """The line a command prints after replacing an existing model folder."""
    return f"{dest} existed: replaced as a whole by the new model (nothing of the old folder kept)"


def output_folder(out, source, writes: tuple = ("model",), field: str = "model") -> Path:
    """`out` as the folder a compression job writes OUT/model and its report into, checked before any work
    as the command line's --out is: UnsafePath naming "out" where it is no path, empty (the working
    folder), a symbolic link, a file, under a file, or is or holds the `source` model folder (the argument
    `field`; None: nothing on disk), whose OUT/model would replace the model read and be measured as its own
    "before", or is one of its model files: utils.apart.refuse_writing_over, the command's refusal."""
    if not isinstance(out, (str, os.PathLike)):
        raise UnsafePath(f"out must be a folder path, got {type(out).__name__}", "out")
    if not str(out).strip():
        raise UnsafePath("out is empty: name the folder to write (\"\" is the working folder)", "out")
    try:
        path = refuse_link(out)
    except UnsafePath as err:  # its words, naming the field
        raise UnsafePath(str(err), "out") from None
    if path.exists() and not path.is_dir():
        raise UnsafePath(f"out {out}: exists and is not a folder", "out")
    if (blocked := blocking_parent(path)) is not None:
        raise UnsafePath(f"out {out}: {blocked}", "out")
    # holding the model at all is refused, as the command's --out is, not only by a written name
    refuse_writing_over(out, (field, source), writes=writes, models=(field,), holds=(field,))
    return path
