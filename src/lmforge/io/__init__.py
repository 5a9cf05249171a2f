"""Saving and loading model directories, in lmforge's format or a registered foreign one.

lmforge's format is config.json + model.safetensors (io/native.py). Other formats register a
reader and a writer here (`register_format`): the Hugging Face converters do so on import
(lmforge/convert), so io never imports the converters that build on it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from lmforge import elmo as _elmo
from lmforge import model as _model
from lmforge.config import ModelConfig
from lmforge.config.options import OptionsError
from lmforge.io.files import CheckpointError, load_state_strict, load_weights, save_tensors
from lmforge.io.labels import HeadLabels, attach, labels_to_write
from lmforge.io.native import (CONFIG_FILE, FORMAT, WEIGHTS_FILE, load_native, native_config, read_meta,
                               save_native)
from lmforge.io.resolve import MODEL_PACKAGES, find_model_dir, find_tokenizer, model_dir
from lmforge.model import Transformer
from lmforge.utils.atomic import UnsafePath, file_kind, writable_folder, writes_over

# format name -> (detect(meta) -> bool, read(path, meta) -> model, write(model, path, labels) -> path), labels
# a HeadLabels (io/labels.py) or None
FOREIGN: dict = {}
# format name -> config(folder, meta, file) -> ModelConfig: its config alone, no weight read (folder_config)
FOREIGN_CONFIGS: dict = {}
# readers of a directory's side files onto its loaded model, fn(model, path), and their writers back beside
# a saved one: the generation settings it recommends (lmforge.generate registers both, so io never imports
# the jobs that build on it)
SIDE_READERS: list = []
SIDE_WRITERS: list = []


def register_format(name: str, detect: Callable, read: Callable, write: Callable,
                    config: Callable | None = None) -> None:
    """Add a foreign checkpoint format (detected from a directory's config.json): detect(meta) -> bool,
    read(path, meta) -> model, write(model, path, labels) -> path (labels: a HeadLabels or None), and
    config(folder, meta, file) -> ModelConfig, its config without the weights (folder_config)."""
    FOREIGN[name] = (detect, read, write)
    if config is not None:
        FOREIGN_CONFIGS[name] = config


def register_side_files(read: Callable, write: Callable | None = None) -> None:
    """Have `read(model, path)` run on every model `load` reads from a directory, and `write(model, path)`
    on every model `save` writes (so that a load and a save keep what `read` read)."""
    for found, hook in ((SIDE_READERS, read), (SIDE_WRITERS, write)):
        if hook is not None and hook not in found:
            found.append(hook)


def save(model: Transformer, path: str | os.PathLike, format: str = FORMAT, state: dict | None = None,
         labels: list[str] | None = None) -> Path:
    """Write `model` (backbone and attached heads) to the directory `path`, as lmforge or a registered
    format ("hf"), never into the folder it was loaded from. `state` replaces model.state_dict() (the
    gathered weights of a sharded model). With format="hf" a classifier's id2label / label2id /
    problem_type are those it was loaded with (task.json, or a Hugging Face config's), or `labels`: one
    unique name per output of its classifier head, for a model that cannot know them (LABEL_i otherwise)."""
    writable_folder(path, "model directory")
    if not isinstance(model, (Transformer, _elmo.ELMo)):  # None or a name failed inside as "no attribute"
        raise OptionsError(f"model must be an lmforge model (lmforge.build, lmforge.load), got "
                           f"{type(model).__name__}", "model")
    if state is not None and not isinstance(state, dict):
        raise OptionsError(f"state must be a mapping of weight names to tensors, got {type(state).__name__}",
                           "state")
    if format not in (FORMAT, *FOREIGN):
        raise OptionsError(f"format={format!r} is not one of {', '.join((FORMAT, *FOREIGN))}", "format")
    if labels is not None and format == FORMAT:  # lmforge's format keeps them in task.json, a task's file
        raise OptionsError("labels are written with format=\"hf\" only (an lmforge model directory keeps its "
                           "labels in the task.json fine-tuning writes)", "labels")
    _refuse_own_folder(model, path)
    if format in FOREIGN:
        written = FOREIGN[format][2](model, path, labels_to_write(model, labels))
    else:
        written = save_native(model, path, state)
    for side in SIDE_WRITERS:
        side(model, written)
    return written


def _refuse_own_folder(model, path) -> None:
    """UnsafePath naming the folder where `path` is the folder `model` was loaded from (links, ../ and hard
    links seen through) or a name a load reads inside it (its vocab.txt): its files would be written over
    the input being read, as the CLI never does (utils.atomic.writes_over, the rule of both)."""
    source = getattr(model, "loaded_from", None)
    if source is None:
        return
    relation = writes_over(source, Path(path).resolve(), model=source)  # x/../m: m even where x is not made
    if relation == "is":
        raise UnsafePath(f"path {path}: is the folder the model was loaded from ({source}); a save never "
                         f"writes over its input: choose another folder", "path")
    if relation:
        raise UnsafePath(f"path {path}: is a file a load reads from the folder the model was loaded from "
                         f"({source}); a save never writes over its input: choose another folder", "path")


def load(path: str | os.PathLike) -> Transformer:
    """Read an lmforge or a foreign (Hugging Face) model directory (or a job's output folder holding
    one in model/ or final/, or an installed model such as all-MiniLM-L6-v2), heads included."""
    path = find_model_dir(path)  # as every --model reads it: OptionsError for no name, else CheckpointError
    refuse_special_files(path)
    meta = read_meta(path)
    model = _read(path, meta)
    attach(model, path, meta)  # the labels its classifier's outputs are called by, for a save as hf
    model.loaded_from = path.resolve()  # a save never writes back into it
    for side in SIDE_READERS:
        side(model, path)
    return model


def refuse_special_files(path: Path) -> None:
    """CheckpointError naming an entry of the model directory that is neither a file nor a folder (a FIFO,
    a socket, a device, or a link to one): reading one blocks forever or never ends (generation_config.json
    as a FIFO hung every load), and no writer puts one there."""
    for entry in path.iterdir():
        kind = file_kind(entry)  # through a link: what a reader would open
        # a dangling link or one not ours to stat: the reader of that file says why
        if kind not in ("a regular file", "a folder", "a broken link") and "not readable" not in kind:
            raise CheckpointError(f"{entry} is not a regular file ({kind}): refusing to read the model "
                                  f"directory")


def folder_config(path: str | os.PathLike) -> ModelConfig:
    """The ModelConfig of model directory `path` (lmforge's or a registered format) from its config.json
    alone, no weight read, as `load` builds it: what load refuses first (a FIFO, a missing or foreign
    config.json) and a config it cannot build are CheckpointErrors naming the file."""
    path = Path(path)
    refuse_special_files(path)  # as load does first: a FIFO generation_config.json would block the read
    return meta_config(read_meta(path), path)


def meta_config(meta: dict, folder: Path, file: Path | None = None) -> ModelConfig:
    """The ModelConfig of config.json's mapping `meta`, in its format, no weight read: `file` (folder's
    config.json unless given) is the file errors name, `folder` where side files are read (Hugging Face's
    generation_config.json); a CheckpointError where it is none of a known format or builds no config."""
    file = Path(folder) / CONFIG_FILE if file is None else file
    if meta.get("format") == FORMAT:
        return native_config(file, meta)
    for name, (detect, _, _) in FOREIGN.items():
        if detect(meta):
            if name not in FOREIGN_CONFIGS:  # registered without config=: its weights are the way in
                raise CheckpointError(f"{file}: format {name!r} has no reader of its config alone")
            return FOREIGN_CONFIGS[name](Path(folder), meta, file)
    raise _unknown_format(file)


def _read(path: Path, meta: dict) -> Transformer:
    """The model of directory `path` whose config.json is `meta`, in its format."""
    if meta.get("format") == FORMAT:
        return load_native(path, meta)
    for detect, read, _ in FOREIGN.values():
        if detect(meta):
            return read(path, meta)
    raise _unknown_format(path)


def _unknown_format(where: Path) -> CheckpointError:
    """The error for a config.json (of the folder or file `where`) of no format lmforge reads."""
    return CheckpointError(f"{where} is neither an lmforge model directory ({CONFIG_FILE} has no "
                           f"\"format\": \"{FORMAT}\") nor one of a known format "
                           f"({', '.join(FOREIGN) or 'none'})")


_model.register_saver(save)  # model.save(...) without the model importing io
_elmo.register_saver(save)  # and ELMo.save, the biLSTM class beside it

__all__ = ["CONFIG_FILE", "CheckpointError", "FOREIGN", "FOREIGN_CONFIGS", "FORMAT", "HeadLabels",
           "MODEL_PACKAGES", "WEIGHTS_FILE", "find_model_dir", "find_tokenizer", "folder_config", "load",
           "load_state_strict", "load_weights", "meta_config", "model_dir", "refuse_special_files",
           "register_format", "register_side_files", "save", "save_tensors"]
