"""Hugging Face checkpoints in and out (see `hf.py`); one file of key maps per family.

Importing this package registers the "hf" format with lmforge.io, so `lmforge.load` reads Hugging
Face directories and `model.save(dir, format="hf")` writes them."""
from lmforge.config import ConfigError
from lmforge.convert.hf import (FAMILIES, family_of, forced_tokens, hf_model_config, load_hf,
                                read_reference_weights, save_hf)
from lmforge.convert.keymap import ConversionError
from lmforge.io import CheckpointError, register_format


def _read_hf(path, meta: dict):
    try:
        return load_hf(path, meta)
    except (ConfigError, ConversionError) as err:
        raise CheckpointError(f"{path}: {err}") from None


def _config_hf(folder, meta: dict, file):
    """The ModelConfig of a Hugging Face config.json `meta` (read from `file`) with its folder's forced
    tokens, no weight read (lmforge.io.folder_config); a CheckpointError naming the file at fault."""
    try:
        forced = forced_tokens(folder)  # its message names generation_config.json
    except ConversionError as err:
        raise CheckpointError(str(err)) from None
    try:
        return hf_model_config({**meta, **forced})[1]
    except ConfigError as err:
        raise CheckpointError(f"{file}: {err}") from None


register_format("hf", lambda meta: "model_type" in meta, _read_hf, save_hf, _config_hf)

__all__ = ["ConversionError", "FAMILIES", "family_of", "load_hf", "read_reference_weights", "save_hf"]
