"""Training checkpoints: written atomically, the last k kept, a corrupt one refused.

A checkpoint is a directory `checkpoints/step-NNNNNNN/` holding the trained module's
weights (safetensors), the optimiser and scheduler states (a tensor-only torch file,
read back with weights_only=True), the RNG states and `trainer.json` (step, config).
It is written under a temporary name and renamed into place, so a run killed at any
moment leaves either the whole checkpoint or none of it.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

PREFIX = "step-"


class CheckpointCorrupt(RuntimeError):
    """A checkpoint directory that cannot be read back; names the file and the reason."""


def rng_states() -> dict:
    """Every RNG the run draws from, as tensors (torch, CUDA, Python, NumPy)."""
    states = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    states["python"] = torch.tensor(list(random.getstate()[1]), dtype=torch.int64)
    _, keys, pos, _, _ = np.random.get_state()
    states["numpy"] = torch.tensor([*keys.tolist(), pos], dtype=torch.int64)
    return states


def set_rng_states(states: dict) -> None:
    """Restore what `rng_states` captured."""
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(states["cuda"]))
    random.setstate((3, tuple(int(x) for x in states["python"]), None))
    keys = states["numpy"].numpy()
    np.random.set_state(("MT19937", keys[:-1].astype(np.uint32), int(keys[-1]), 0, 0.0))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(root: Path, step: int, weights: dict, optimizer: dict, info: dict, keep_last: int) -> Path:
    """Write checkpoint `step` under root/ atomically and delete all but the newest `keep_last`."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:07d}"
    tmp = root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    # tied tensors (a shared embedding) would make safetensors refuse the file: store copies
    save_file({k: v.detach().to("cpu").clone().contiguous() for k, v in weights.items()},
              str(tmp / "model.safetensors"))
    torch.save({**optimizer, "rng": rng_states()}, tmp / "optimizer.pt")
    (tmp / "trainer.json").write_text(json.dumps({"step": step, **info}, indent=2), encoding="utf-8")
    for file in tmp.iterdir():
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())
    if final.exists():  # a re-run of the same step replaces it
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoints(root: Path) -> list:
    """Complete checkpoint directories under root, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def read_checkpoint(path: Path) -> tuple:
    """(weights, optimiser state, trainer info) of one checkpoint, or CheckpointCorrupt."""
    try:
        info = json.loads((path / "trainer.json").read_text(encoding="utf-8"))
        weights = load_file(str(path / "model.safetensors"))
        optimizer = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    except (OSError, ValueError, SafetensorError, RuntimeError, EOFError, pickle.UnpicklingError) as err:
        raise CheckpointCorrupt(f"checkpoint {path} cannot be read: {err}") from None
    if not isinstance(info, dict) or "step" not in info:
        raise CheckpointCorrupt(f"checkpoint {path}: trainer.json has no step")
    return weights, optimizer, info


def latest_checkpoint(root: Path, warn=print):
    """The newest readable checkpoint (path, weights, optimiser, info), skipping corrupt ones; or None."""
    for path in reversed(checkpoints(root)):
        try:
            return (path, *read_checkpoint(path))
        except CheckpointCorrupt as err:
            warn(f"{err}; falling back to the previous checkpoint")
    return None
