"""Files under every format: atomic safetensors writes and strict, named weight loading.

Weights are read only from safetensors (never pickle). Files are written to a
temporary name and renamed, so an interrupted save never leaves a half-written
file behind. Loading is strict: a missing, unexpected or mis-shaped weight is
an error that names it.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file


class CheckpointError(ValueError):
    """A model directory that cannot be read: missing files, foreign or corrupt contents."""


def save_tensors(tensors: dict, file: Path, metadata: dict) -> None:
    """Write a safetensors file atomically: a temporary file in the same folder, then a rename."""
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.")
    os.close(fd)
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp, metadata=metadata)
        os.replace(tmp, file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_state_strict(model: torch.nn.Module, tensors: dict, source) -> None:
    """Load `tensors` into `model` only if names and shapes fit exactly; name every mismatch."""
    own = model.state_dict()
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    shapes = [f"{k} {tuple(tensors[k].shape)} != {tuple(own[k].shape)}"
              for k in sorted(set(own) & set(tensors)) if tensors[k].shape != own[k].shape]
    problems = [f"missing: {missing}" * bool(missing), f"unexpected: {unexpected}" * bool(unexpected),
                f"wrong shape: {shapes}" * bool(shapes)]
    if any(problems):
        raise CheckpointError(f"weights in {source} do not fit the model: " + "; ".join(p for p in problems if p))
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in tensors.items()}, strict=True)


def load_weights(model: torch.nn.Module, file: Path) -> None:
    """Load a safetensors file into `model` strictly, naming every mismatch."""
    try:
        tensors = load_file(str(file))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"cannot read weights from {file}: {err}") from None
    load_state_strict(model, tensors, file)
