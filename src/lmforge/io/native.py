"""lmforge's own model directory: config.json (config and head specs) + model.safetensors."""
from __future__ import annotations

import json
import os
from pathlib import Path

from lmforge.config import ConfigError, ModelConfig, atomic_write_text
from lmforge.heads import make_head
from lmforge.io.files import CheckpointError, load_weights, save_tensors
from lmforge.model import Transformer, from_config

FORMAT = "lmforge"
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


def save_native(model: Transformer, path: str | os.PathLike, state: dict | None = None) -> Path:
    """Write config.json and model.safetensors; `state` replaces model.state_dict()."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_tensors(model.state_dict() if state is None else state, path / WEIGHTS_FILE, {"format": FORMAT})
    meta = {"format": FORMAT, "config": model.config.to_dict(),
            "heads": {name: head.spec for name, head in model.heads.items()}}
    atomic_write_text(path / CONFIG_FILE, json.dumps(meta, indent=2) + "\n")
    return path


def read_meta(path: Path) -> dict:
    """The parsed config.json of a model directory (lmforge's or a foreign one)."""
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


def load_native(path: Path, meta: dict) -> Transformer:
    """Build the model config.json describes and load its weights strictly."""
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
