"""Hugging Face checkpoints into lmforge: config mapping, declarative key maps, strict loading.

Weights are read from model.safetensors, sharded safetensors with an index, or
pytorch_model.bin through `torch.load(weights_only=True)` — never unpickled freely.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from lmforge.config import ConfigError
from lmforge.convert import bert, gpt2
from lmforge.convert.keymap import ConversionError, expand, import_tensors
from lmforge.heads import make_head
from lmforge.model import Transformer, from_config

__all__ = ["ConversionError", "FAMILIES", "load_hf", "read_reference_weights"]

FAMILIES = {t: fam.FAMILY for fam in (bert, gpt2) for t in fam.FAMILY.model_types}


def read_reference_weights(path: Path) -> dict:
    """All tensors of a reference model directory, by name."""
    index = path / "model.safetensors.index.json"
    try:
        if (path / "model.safetensors").is_file():
            return load_file(str(path / "model.safetensors"))
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            return {k: v for shard in shards for k, v in load_file(str(path / shard)).items()}
        if (path / "pytorch_model.bin").is_file():
            return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, KeyError, json.JSONDecodeError) as err:
        raise ConversionError(f"cannot read the weights in {path}: {err}") from None
    raise ConversionError(f"{path} has no model.safetensors, sharded index or pytorch_model.bin")


def load_hf(path: str | Path, hf_config: dict | None = None) -> Transformer:
    """Load a Hugging Face model directory as an lmforge model, heads included."""
    path = Path(path)
    hf = hf_config or json.loads((path / "config.json").read_text(encoding="utf-8"))
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
        raise ConfigError(f"model_type {model_type!r} is not supported; supported: {', '.join(FAMILIES)}")
    family = FAMILIES[model_type]
    try:
        cfg = family.config(hf)
    except KeyError as err:
        raise ConfigError(f"config.json of {model_type} lacks the field {err}") from None
    model = from_config(cfg, init=False)
    architecture = (hf.get("architectures") or [None])[0]
    if architecture not in family.heads:
        raise ConfigError(f"architecture {architecture!r} is not supported for {model_type}; "
                          f"supported: {', '.join(family.heads)}")
    rules = expand(family.backbone(cfg), cfg.n_layers)
    for name, kind, args in family.heads[architecture](hf):
        model.add_head(name, make_head(model, kind, **args))
        rules += family.head_rules(name, kind, cfg)
    tensors = {k.removeprefix(family.prefix): v for k, v in read_reference_weights(path).items()}
    ours = import_tensors(tensors, rules, family.ignore)
    own = model.state_dict()
    missing = sorted(set(own) - set(ours))
    wrong = [f"{k} {tuple(v.shape)} != {tuple(own[k].shape)}" for k, v in ours.items() if v.shape != own[k].shape]
    if missing or wrong:
        raise ConversionError(f"{path}: missing {missing[:8]}; wrong shape {wrong[:8]}")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in ours.items()}, strict=True)
    return model.eval()
