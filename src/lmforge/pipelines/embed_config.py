"""A sentence-transformers directory's own files, read and checked for SentenceEncoder.from_dir: modules.json
(Transformer -> Pooling [-> Normalize]), the Pooling module's config.json and sentence_bert_config.json."""
from __future__ import annotations

from pathlib import Path

from lmforge.io import CheckpointError
from lmforge.io.native import read_json_object
from lmforge.pipelines.embed_pooling import POOLINGS
from lmforge.utils.errors import shown

# sentence-transformers' legacy boolean pooling keys, in its concatenation order
LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                  "pooling_mode_mean_tokens": "mean",
                  "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                  "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")


def pooling_modes(path: Path) -> tuple:
    """The pooling modes of a sentence-transformers directory (modules.json), mean by default."""
    return pooling_config(path)[0]


def pooling_config(path: Path) -> tuple:
    """(pooling modes, include_prompt) of a sentence-transformers directory's modules.json: (mean,) and True
    without one; modules other than Transformer -> Pooling [-> Normalize] are refused naming the file (they
    would be skipped, or run out of their order: another vector than sentence-transformers gives)."""
    file = path / "modules.json"
    if not file.is_file():
        return ("mean",), True
    modules, kinds, found = read_json_object(file, list), [], (("mean",), True)
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1] if isinstance(module, dict) else None
        if kind not in KNOWN_MODULES:
            said = module.get("type") if isinstance(module, dict) else module
            raise CheckpointError(f"{file}: module {str(said)[:60]!r} is not supported "
                                  f"(supported: {', '.join(KNOWN_MODULES)})")
        config_file = path / str(module.get("path", "")) / "config.json"
        if kind == "Pooling" and not config_file.is_file():  # mean was assumed, unsaid (a CLS model's too)
            raise CheckpointError(f"{config_file}: missing, though {file} names its Pooling module")
        if kind == "Pooling":
            found = _pooling(config_file)
        kinds.append(kind)
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise CheckpointError(f"{file}: modules {' -> '.join(kinds) or '(none)'}; lmforge runs Transformer "
                              "-> Pooling, then Normalize or not")
    if str(modules[0].get("path", "")).strip("./"):  # an older layout: the model in a folder (0_BERT/)
        raise CheckpointError(f"{file}: the Transformer is in {modules[0]['path']!r}; lmforge reads the "
                              f"model from {path} itself (move that folder's files there)")
    return found


def _pooling(file: Path) -> tuple:
    """(modes, include_prompt) of a Pooling module's config.json, in sentence-transformers' order."""
    config = read_json_object(file)
    chosen = config.get("pooling_mode") or [m for k, m in LEGACY_POOLING.items() if config.get(k)]
    modes = (chosen,) if isinstance(chosen, str) else chosen
    if not isinstance(modes, (list, tuple)) or not all(isinstance(m, str) for m in modes):
        raise CheckpointError(f"{file}: pooling_mode must be a mode or a list of modes, got "
                              f"{shown(chosen)}")
    unknown = [m for m in modes if m not in POOLINGS]
    if unknown:
        raise CheckpointError(f"{file}: pooling mode {unknown[0]!r} is not one of {', '.join(POOLINGS)}")
    include = config.get("include_prompt", True)
    if not isinstance(include, bool):
        raise CheckpointError(f"{file}: include_prompt must be true or false, got {shown(include)}")
    return tuple(modes) or ("mean",), include


def sentence_config(path: Path) -> dict:
    """sentence_bert_config.json ({} without one), its max_seq_length checked: an integer >= 0, or null."""
    file = path / "sentence_bert_config.json"
    config = read_json_object(file) if file.is_file() else {}
    limit = config.get("max_seq_length")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise CheckpointError(f"{file}: max_seq_length must be a whole number of tokens, got "
                              f"{shown(limit)}")
    return config
