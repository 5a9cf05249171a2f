"""Saving and loading lmforge model directories: config.json + model.safetensors.

Weights are read only from safetensors (never pickle). Files are written to a
temporary name and renamed, so an interrupted save never leaves a half-written
model behind. Loading is strict: a missing, unexpected or mis-shaped weight is
an error that names it.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from lmforge.config import ConfigError, ModelConfig, atomic_write_text
from lmforge.heads import make_head
from lmforge.model import Transformer, from_config

FORMAT = "lmforge"
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


class CheckpointError(ValueError):
    """A model directory that cannot be read: missing files, foreign or corrupt contents."""


def save(model: Transformer, path: str | os.PathLike, format: str = FORMAT, state: dict | None = None) -> Path:
    """Write `model` (backbone and attached heads) to the directory `path`, as lmforge or "hf".

    `state` replaces model.state_dict() (the gathered weights of a sharded model)."""
    if format == "hf":
        from lmforge.convert import save_hf

        return save_hf(model, path)
    if format != FORMAT:
        raise ValueError(f"format={format!r} is not one of {FORMAT}, hf")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_tensors(model.state_dict() if state is None else state, path / WEIGHTS_FILE, {"format": FORMAT})
    meta = {"format": FORMAT, "config": model.config.to_dict(),
            "heads": {name: head.spec for name, head in model.heads.items()}}
    atomic_write_text(path / CONFIG_FILE, json.dumps(meta, indent=2) + "\n")
    return path


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


def _read_meta(path: Path) -> dict:
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise CheckpointError(f"{path} is not a model directory: {CONFIG_FILE} is missing")
    try:
        meta = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{config_file} is not valid JSON: {err}") from None
    if not isinstance(meta, dict) or (meta.get("format") != FORMAT and "model_type" not in meta):
        raise CheckpointError(f"{path} is neither an lmforge model directory ({CONFIG_FILE} has no "
                              f"\"format\": \"{FORMAT}\") nor a Hugging Face one (no \"model_type\")")
    return meta


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


def load(path: str | os.PathLike) -> Transformer:
    """Read an lmforge or a Hugging Face model directory (heads included)."""
    path = Path(path)
    meta = _read_meta(path)
    if meta.get("format") != FORMAT:
        from lmforge.convert import ConversionError, load_hf  # converters build on this module

        try:
            return load_hf(path, meta)
        except (ConfigError, ConversionError) as err:
            raise CheckpointError(f"{path}: {err}") from None
    try:
        cfg = ModelConfig.from_dict(meta.get("config", {}))
    except (ConfigError, TypeError) as err:
        raise CheckpointError(f"{path / CONFIG_FILE}: {err}") from None
    model = from_config(cfg, init=False)
    for name, spec in meta.get("heads", {}).items():
        spec = dict(spec)
        model.add_head(name, make_head(model, spec.pop("kind"), **spec))
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{path} has no {WEIGHTS_FILE}")
    load_weights(model, weights)
    return model
