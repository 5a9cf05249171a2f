"""Where a job's output folder keeps its model, so every loader reads a folder a job wrote; the checksums
its config.json records of the files written beside the model."""
from __future__ import annotations

import json
from pathlib import Path

from lmforge.utils.atomic import atomic_write_text
from lmforge.utils.checksum import sha256
from lmforge.utils.jsonfile import json_object

# a job's --out folder holds its model in one of these (quantize, prune: model/; pretrain, finetune,
# distill: final/): naming the folder itself loads it, so every loader reads what a job wrote
JOB_MODEL_FOLDERS = ("model", "final")
CONFIG, SUMS = "config.json", "sha256"  # a model folder's config and its field of file checksums (io/native)


def inside_job_folder(path: Path) -> Path:
    """`path`, or the model folder inside a job's output folder that has no model of its own."""
    if (path / "config.json").is_file():
        return path
    return next((path / sub for sub in JOB_MODEL_FOLDERS if (path / sub / "config.json").is_file()), path)


def _own_config(folder: Path) -> dict | None:
    """An lmforge model folder's config.json, or None (none there, a Hugging Face one, not readable: the
    loader that reads it says why)."""
    meta = json_object(folder / CONFIG)
    return meta if meta is not None and meta.get("format") == "lmforge" else None


def record_sums(folder, names) -> bool:
    """Add the sha256 of each of `names`, files just written beside a model, to its config.json's checksums
    (the weights' map), so that their readers verify them (check_recorded) as every load verifies the
    weights; whether it did. A folder without an lmforge config.json (a tokenizer alone, a Hugging Face
    model) records none."""
    folder = Path(folder)
    meta = _own_config(folder)
    if meta is None or not isinstance(meta.get(SUMS), dict):
        return False
    meta[SUMS].update({name: sha256(folder / name) for name in names if (folder / name).is_file()})
    atomic_write_text(folder / CONFIG, json.dumps(meta, indent=2) + "\n")
    return True


def check_recorded(folder, name: str, error: type = ValueError) -> None:
    """error naming folder/name where its config.json records its checksum and the file is gone or does not
    match it (changed or damaged since it was written); nothing where none is recorded."""
    folder = Path(folder)
    sums = (_own_config(folder) or {}).get(SUMS)
    want = sums.get(name) if isinstance(sums, dict) else None
    if want is None:
        return
    if not (folder / name).is_file():
        raise error(f"{folder / name}: missing, though {folder / CONFIG} records its checksum")
    try:
        found = sha256(folder / name)
    except OSError as err:  # unreadable (permissions, a pipe's error): said as the file's, not a bare OSError
        raise error(f"cannot read {folder / name}: {err.strerror or err}") from None
    if found != want:
        raise error(f"{folder / name} does not match its checksum in {CONFIG} (changed or damaged since it "
                    f"was written; an edit made on purpose: drop {name} from {CONFIG}'s \"{SUMS}\")")
