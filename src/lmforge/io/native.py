"""lmforge's own model directory: config.json (config and head specs) + model.safetensors."""
from __future__ import annotations

import json
import os
from pathlib import Path

from lmforge.config import ConfigError, ModelConfig, atomic_write_text
from lmforge.heads import make_head
from lmforge.io.files import CheckpointError, load_weights, save_tensors
from lmforge.model import Transformer, from_config
from lmforge.quant.int8 import swap_linears
from lmforge.quant.int8_embedding import swap_tokens
from lmforge.utils.checksum import json_sha256, sha256
from lmforge.utils.jsontext import loads
from lmforge.utils.errors import shown

FORMAT = "lmforge"
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
CHECKSUMS = "sha256"  # config.json's field: file name -> hex sha256
CONFIG_SUM = "config_sha256"  # config.json's checksum of its own "config" and "heads" (what builds the model)


def save_native(model: Transformer, path: str | os.PathLike, state: dict | None = None) -> Path:
    """Write config.json and model.safetensors; `state` replaces model.state_dict(). config.json records
    the weights' checksum, which every load verifies."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_tensors(model.state_dict() if state is None else state, path / WEIGHTS_FILE, {"format": FORMAT})
    meta = {"format": FORMAT, "config": model.config.to_dict(),
            "heads": {name: head.spec for name, head in model.heads.items()},
            CHECKSUMS: {WEIGHTS_FILE: sha256(path / WEIGHTS_FILE)}}
    meta[CONFIG_SUM] = _config_sum(json.loads(json.dumps(meta)))  # of what a reader will see
    atomic_write_text(path / CONFIG_FILE, json.dumps(meta, indent=2) + "\n")
    return path


def read_json_object(file: Path, kind: type = dict) -> dict | list:
    """The JSON object (mapping; kind=list: the list) of a model directory's JSON file (config.json,
    task.json, modules.json): not UTF-8, not JSON or not of `kind` is a one-line CheckpointError naming the
    file and what is wrong."""
    try:
        data = loads(Path(file).read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{file} is not UTF-8 text (byte {err.start}): not JSON") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{file} is not valid JSON: {err}") from None
    except OSError as err:  # unreadable (permissions), a folder, gone: one line naming it
        raise CheckpointError(f"cannot read {file}: {err.strerror or err}") from None
    if not isinstance(data, kind):
        wanted = "a JSON object {...}" if kind is dict else "a JSON list [...]"
        raise CheckpointError(f"{file} must hold {wanted}, not {type(data).__name__} {shown(data)}")
    return data


def read_meta(path: Path) -> dict:
    """The parsed config.json of a model directory (lmforge's or a foreign one)."""
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        hint = ""
        if path.is_dir() and any(p.suffix.lower() in (".hdf5", ".h5") for p in path.iterdir()):
            hint = f" (AllenNLP's ELMo weights? bring them in first: lmforge convert {path} OUT)"
        raise CheckpointError(f"{path} is not a model directory: {CONFIG_FILE} is missing{hint}")
    meta = read_json_object(config_file)
    if meta.get("format") != FORMAT and "model_type" not in meta:
        raise CheckpointError(f"{path} is neither an lmforge model directory ({CONFIG_FILE} has no "
                              f"\"format\": \"{FORMAT}\") nor a Hugging Face one (no \"model_type\")")
    return meta


def _as_meant(config: dict) -> dict:
    """A config saved before position_from_padding existed, read as it was meant: an encoder's learned
    positions from an offset (the RoBERTa preset's and converter's, no other) count past the padding, as the
    reference RoBERTa's do, so that the model still exports to it."""
    offset = config.get("position_offset")
    roberta = (config.get("architecture", "encoder") == "encoder" and isinstance(offset, int) and offset >= 1
               and config.get("position", "learned") == "learned")
    return {**config, "position_from_padding": True} if roberta and "position_from_padding" not in config \
        else config


def native_config(file: Path, meta: dict) -> ModelConfig:
    """The ModelConfig of lmforge's config.json mapping `meta` (read from `file`), as a load builds it; a
    CheckpointError naming `file` where its "config" is no valid one."""
    config = meta.get("config", {})
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: field \"config\" must be a mapping of config fields, "
                              f"got {type(config).__name__} {shown(config)}")
    try:
        return ModelConfig.from_dict(_as_meant(config))
    except (ConfigError, TypeError) as err:
        raise CheckpointError(f"{file}: {err}") from None


def load_native(path: Path, meta: dict) -> Transformer:
    """Build the model config.json describes and load its weights strictly."""
    cfg = native_config(path / CONFIG_FILE, meta)
    model = from_config(cfg, init=False)
    for name, head in _heads(path / CONFIG_FILE, model, meta.get("heads", {})).items():
        try:
            model.add_head(name, head)
        except KeyError:  # a name the head container reserves ("keys", "update", ...)
            raise CheckpointError(f"{path / CONFIG_FILE}: heads.{name}: not usable as a head name") from None
    if cfg.quantization:  # int8 Linears (compress/quantize.py), empty until the weights load
        smoothed = dict.fromkeys((cfg.quantization.get("smoothing") or {}).get("layers", ()), True)
        swapped = swap_linears(model, cfg.quantization["mode"], cfg.quantization.get("kept_fp32", ()), False,
                               smoothed)
        unknown = sorted(set(smoothed) - set(swapped))
        if unknown:
            raise CheckpointError(f"{path / CONFIG_FILE}: quantization.smoothing.layers names "
                                  f"{unknown[0]!r}, not an int8 Linear of this model")
        if cfg.quantization.get("tokens"):
            swap_tokens(model, quantise=False)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{path} has no {WEIGHTS_FILE}")
    load_weights(model, weights)  # first: a truncated file, a wrong shape or a NaN is said as such
    check_sums(path, meta)
    check_config_sum(path, meta)  # last: an edit that breaks the config is named as such first
    return model.eval()  # as a Hugging Face directory loads (and from_pretrained): training turns dropout on


def check_sums(path: Path, meta: dict) -> None:
    """CheckpointError naming the file where config.json records a checksum its file does not match (a
    flipped byte of the weights loads as other weights: safetensors checks only the layout). A folder
    written before the checksums were recorded has none to check."""
    sums = meta.get(CHECKSUMS, {})
    if not isinstance(sums, dict) or any(not isinstance(v, str) for v in sums.values()):
        raise CheckpointError(f"{path / CONFIG_FILE}: \"{CHECKSUMS}\" must map file names to checksums")
    for name, want in sums.items():
        if name != WEIGHTS_FILE:  # the one file this loader reads; another is not its to judge
            continue
        if sha256(path / name) != want:
            raise CheckpointError(f"{path / name} does not match its checksum in {CONFIG_FILE} (changed or "
                                  f"damaged since it was written)")


def _config_sum(meta: dict) -> str:
    return json_sha256({"config": meta.get("config"), "heads": meta.get("heads", {})})


def check_config_sum(path: Path, meta: dict) -> None:
    """CheckpointError where config.json's "config" or "heads" do not match its own checksum of them: a
    flipped digit (norm_eps 1e-12 -> 1e-13) or word (gelu -> relu) builds another model that the weights
    fit, silently. A folder written before the checksum has none to check."""
    if CONFIG_SUM in meta and meta[CONFIG_SUM] != _config_sum(meta):
        raise CheckpointError(f"{path / CONFIG_FILE}: its \"config\" or \"heads\" do not match its "
                              f"\"{CONFIG_SUM}\" (changed or damaged since it was written; an edit made on "
                              f"purpose: drop \"{CONFIG_SUM}\")")


def _heads(config_file: Path, model: Transformer, specs) -> dict:
    """The heads config.json's "heads" describes ({name: {"kind": ..., options}}), built for `model`;
    anything else in the field is an error naming the file and the head."""
    if not isinstance(specs, dict):
        raise CheckpointError(f"{config_file}: field \"heads\" must be a mapping of head name to "
                              f"{{\"kind\": ...}}, got {type(specs).__name__} {shown(specs)}")
    heads = {}
    for name, spec in specs.items():
        where = f"{config_file}: heads.{name}"
        if not name or "." in name:
            raise CheckpointError(f"{where}: a head name must be non-empty and without dots")
        if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
            raise CheckpointError(f"{where} must be a mapping with a \"kind\" (e.g. {{\"kind\": \"lm\"}}), "
                                  f"got {shown(spec)}")
        options = {k: v for k, v in spec.items() if k != "kind"}
        try:
            heads[name] = make_head(model, spec["kind"], **options)
        except (ConfigError, TypeError, ValueError) as err:  # an unknown kind or option, a bad value
            raise CheckpointError(f"{where}: {err}") from None
    return heads
