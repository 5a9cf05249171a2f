"""Hugging Face checkpoints in and out: config mapping, declarative key maps, strict loading.

Weights are read from model.safetensors, sharded safetensors with an index, or
pytorch_model.bin through `torch.load(weights_only=True)` — never unpickled freely.
"""
from __future__ import annotations

import importlib
import json
import pickle
import re
from dataclasses import fields
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from lmforge.config import SPECIAL_TOKENS, ConfigError, ModelConfig, atomic_write_text
from lmforge.convert.keymap import ConversionError, expand, export_tensors, import_tensors
from lmforge.heads import make_head
from lmforge.io.files import describe_read_error, load_state_strict, save_tensors
from lmforge.io.labels import ACTIVATION_FNS, HeadLabels, n_outputs
from lmforge.model import Transformer, from_config
from lmforge.utils import jsontext
from lmforge.utils.errors import shown

# one module per reference family under lmforge/convert/, each defining FAMILY
MODULES = (
    "bert",
    "roberta",
    "distilbert",
    "albert",
    "electra",
    "gpt2",
    "xlnet",
    "t5",
    "bart",
    "openai_gpt",
    "llama",
    "mistral",
    "bloom",
    "longformer",
    "big_bird",
)
FAMILIES = {t: fam.FAMILY for fam in (importlib.import_module(f"lmforge.convert.{m}") for m in MODULES)
            for t in fam.FAMILY.model_types}


# what a damaged or hostile weights file raises (weights_only refuses code in a pickle)
READ_ERRORS = (SafetensorError, OSError, RuntimeError, KeyError, json.JSONDecodeError, pickle.UnpicklingError)


def _index_shards(path: Path, index: Path) -> dict:
    """{shard file: the tensor names the index places there} of a sharded checkpoint."""
    try:
        weight_map = jsontext.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = {}
        for name, shard in weight_map.items():
            shards.setdefault(shard, set()).add(name)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConversionError(f"cannot read the weights in {path}: {index.name} is damaged ({err})") from None
    # the reference writes its shards beside the index: a name reaching elsewhere ("../other/x",
    # "/etc/passwd") would read another model's weights, or any file, as this one's
    outside = [s for s in shards if not isinstance(s, str) or Path(s).name != s or s in ("", ".", "..")]
    if outside:
        raise ConversionError(f"cannot read the weights in {path}: {index.name} names a shard "
                              f"{str(outside[0])[:80]!r} that is not a file of the folder")
    return {path / shard: names for shard, names in sorted(shards.items())}


def _reference_files(path: Path) -> dict:
    """The weight files of a reference directory, each with the tensor names it must hold (None: any):
    one safetensors or pytorch_model.bin file, or the shards an index of either names."""
    # the reference's order of preference: safetensors, whole then sharded, before pickled tensors
    for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json"):
        if (path / name).is_file():
            return _index_shards(path, path / name) if name.endswith(".index.json") else {path / name: None}
    raise ConversionError(f"{path} has no model.safetensors, pytorch_model.bin, or index of shards of either")


def _check_shard(path: Path, file: Path, found: dict, expected, tensors: dict) -> None:
    """Refuse a shard holding other tensors than its index says, or one read already from another shard:
    which copy won was the order the shards were read in, unsaid."""
    twice = sorted(set(found) & set(tensors))
    if twice:
        raise ConversionError(f"cannot read the weights in {path}: {file.name} holds {twice[0]!r}, "
                              "which another shard holds too")
    for names, what in ((sorted(set(found) - expected), "holds"), (sorted(expected - set(found)), "lacks")):
        if names:
            raise ConversionError(f"cannot read the weights in {path}: {file.name} {what} {names[0]!r}, "
                                  f"against its index ({len(names)} tensor(s))")


def read_reference_weights(path: Path) -> dict:
    """All tensors of a reference model directory, by name; shards checked against their index."""
    tensors = {}
    for file, expected in _reference_files(path).items():
        try:
            if file.suffix == ".bin":
                found = torch.load(file, map_location="cpu", weights_only=True)
            else:
                found = load_file(str(file))
        except READ_ERRORS as err:
            raise ConversionError(f"cannot read the weights in {path}: "
                                  f"{describe_read_error(file, err)}") from None
        if not isinstance(found, dict) or not all(isinstance(t, torch.Tensor) for t in found.values()):
            raise ConversionError(f"cannot read the weights in {path}: {file.name} holds no state dict "
                                  "(a mapping of names to tensors)")
        if expected is not None:
            _check_shard(path, file, found, expected, tensors)
        tensors.update(found)
    return tensors


def forced_tokens(path: Path) -> dict:
    """Forced first/last generated tokens of generation_config.json: where that file exists the
    reference takes them from it alone (absent means none), not from config.json."""
    file = path / "generation_config.json"
    try:
        generation = jsontext.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:  # read as none: other tokens, unsaid
        raise ConversionError(f"{file}: not readable as JSON ({err})") from None
    if not isinstance(generation, dict):
        raise ConversionError(f"{file}: not a JSON object {{...}} but {type(generation).__name__}")
    return {k: generation.get(k) for k in ("forced_bos_token_id", "forced_eos_token_id")}


# decoding settings a checkpoint may recommend (the reference's GenerationConfig field names)
GENERATION_KEYS = ("max_length", "max_new_tokens", "min_length", "min_new_tokens", "do_sample", "temperature",
                   "top_k", "top_p", "num_beams", "length_penalty", "early_stopping", "no_repeat_ngram_size",
                   "repetition_penalty")


def generation_defaults(path: str | Path) -> dict:
    """The decoding settings a model directory recommends: generation_config.json's, or where that
    file is absent the same keys in config.json (older checkpoints such as BART's keep them there).
    Only keys present with a value; {} when neither file has any."""
    path = Path(path)
    for name in ("generation_config.json", "config.json"):
        try:
            found = jsontext.loads((path / name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(found, dict):
            continue
        return {k: found[k] for k in GENERATION_KEYS if found.get(k) is not None}
    return {}


def hf_model_config(hf: dict) -> tuple:
    """(the family, the ModelConfig) of a Hugging Face config.json's mapping (its forced tokens merged in);
    a ConfigError for a model_type lmforge does not read or a field the family needs missing."""
    model_type, architectures = hf.get("model_type"), hf.get("architectures")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise ConfigError(f"model_type {model_type!r} is not supported; supported: {', '.join(FAMILIES)}",
                          "model_type")
    if architectures is not None and not (isinstance(architectures, list)
                                          and all(isinstance(a, str) for a in architectures)):
        raise ConfigError(f"architectures must be a list of class names, got {shown(architectures)}",
                          "architectures")
    family = FAMILIES[model_type]
    try:
        return family, family.config(hf)
    except KeyError as err:
        raise ConfigError(f"config.json of {model_type} lacks the field {err}", err.args[0]) from None


def load_hf(path: str | Path, hf_config: dict | None = None) -> Transformer:
    """Load a Hugging Face model directory as an lmforge model, heads included."""
    path = Path(path)
    hf = hf_config or jsontext.loads((path / "config.json").read_text(encoding="utf-8"))
    hf = {**hf, **forced_tokens(path)}
    family, cfg = hf_model_config(hf)
    model_type = hf["model_type"]
    architecture = (hf.get("architectures") or [None])[0]
    if architecture not in family.heads:
        raise ConfigError(f"architecture {architecture!r} is not supported for {model_type}; "
                          f"supported: {', '.join(family.heads)}", "architectures")
    tensors = {k.removeprefix(family.prefix): v for k, v in read_reference_weights(path).items()}
    if family.refine is not None:
        cfg = family.refine(cfg, tensors)
    model = from_config(cfg, init=False)
    rules = expand(family.backbone(cfg), cfg.n_layers)
    for name, kind, args in family.heads[architecture](hf):
        head_rules = family.head_rules(name, kind, cfg)
        if name in family.optional and not any(t in tensors for r in head_rules for t in r.theirs):
            continue  # saved without it (add_pooling_layer=False): the model has no such head
        model.add_head(name, make_head(model, kind, **args))
        rules += head_rules
    _check_shapes(tensors, model, rules)
    load_state_strict(model, import_tensors(tensors, rules, family.ignore), path)
    return model.eval()


def _split_sizes(cfg: ModelConfig) -> dict:
    """How a fused lmforge tensor splits into 2 (cross-attention k, v) or 3 (q, k, v) reference ones."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    return {2: [kv, kv], 3: [q, kv, kv]}


def _check_shapes(tensors: dict, model: Transformer, rules: list) -> None:
    """Refuse a reference tensor whose shape is not the one its config gives, or that holds no floats,
    naming it: a fused one raised a bare RuntimeError, and XLNet's (d_model, n_heads, d_head) operands
    loaded reshaped into other heads. The shapes wanted are the model's, exported on the meta device."""
    meta = {k: torch.empty(v.shape, device="meta") for k, v in model.state_dict().items()}
    want = export_tensors(meta, [r for r in rules if r.ours in meta], _split_sizes(model.config))
    for name in sorted(set(want) & set(tensors)):
        got = tensors[name]
        if got.shape != want[name].shape:
            raise ConversionError(f"the checkpoint's {name} has shape {tuple(got.shape)}, where its "
                                  f"config.json gives {tuple(want[name].shape)}")
        if not got.is_floating_point():
            raise ConversionError(f"the checkpoint's {name} holds {got.dtype} values, not floating-point "
                                  "weights")


def family_of(cfg: ModelConfig):
    """The reference family that expresses `cfg` exactly (its config maps there and back)."""
    if cfg.quantization:
        raise ConversionError(f"the model is int8-quantised ({cfg.quantization['mode']}), which the Hugging "
                              "Face format does not hold; export the fp32 model, or save this one in "
                              "lmforge's format")
    if cfg.pruned_heads:  # transformers v5 dropped pruned_heads: every layer has num_attention_heads
        raise ConversionError(f"the model's heads were pruned per layer ({len(cfg.pruned_heads)} attentions "
                              "changed), which no Hugging Face config expresses; save it in lmforge's format")
    plain, near = cfg.canonical(), {}  # near: family -> the fields its round trip changes
    for model_type, family in FAMILIES.items():
        try:
            theirs = family.config(family.to_reference(cfg)).canonical()
        except ConfigError:
            continue
        if theirs == plain:
            return model_type, family
        changed = [f.name for f in fields(plain) if getattr(plain, f.name) != getattr(theirs, f.name)]
        near[model_type] = changed
    fewest = min(map(len, near.values()), default=0)
    closest = [f"{name} ({', '.join(changed)})" for name, changed in near.items() if len(changed) == fewest]
    hint = f"; closest, changing the fields named: {'; '.join(closest)}" if 0 < fewest <= 2 else ""
    raise ConversionError("no Hugging Face family expresses this configuration exactly; "
                          f"supported families: {', '.join(FAMILIES)}{hint}")


def _loads_as(family, hf: dict, architecture: str):
    try:
        return family.config({**hf, "architectures": [architecture]}).canonical()
    except ConfigError:
        return None


def _head_specs(family, model: Transformer, hf: dict, architecture: str) -> dict:
    """{head name: the spec of the head the reference architecture computes}, built on the meta device
    (nothing allocated) as load_hf builds it."""
    with torch.device("meta"):
        return {name: make_head(model, kind, **args).spec
                for name, kind, args in family.heads[architecture](hf)}


# the head arguments a spec records only where they differ from these
SPEC_DEFAULTS = {"bias": True, "ffn": False}


def _spec_change(architecture: str, name: str, theirs: dict, ours: dict) -> str:
    """What the architecture's head `name` computes differently from the model's, field by field."""
    theirs, ours = {**SPEC_DEFAULTS, **theirs}, {**SPEC_DEFAULTS, **ours}  # a spec leaves defaults out
    changed = [k for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k)]
    return (f"{architecture} computes its {name} head with " + ", ".join(
        f"{k}={theirs.get(k)!r} (this model's head: {ours.get(k)!r})" for k in changed))


def _architecture(family, model: Transformer, hf: dict) -> str:
    names, plain = set(model.heads), model.config.canonical()
    specs = {architecture: _head_specs(family, model, hf, architecture) for architecture in family.heads}
    # the heads must match, exactly or less optional ones the model lacks (a pooler-less BertModel),
    # each computed as the model's is (a GPT-2 classifier pooling the first token, with a pooler and a
    # bias, was written as the reference's last-token score: those dropped, unsaid), and so must the
    # model an architecture loads as (T5EncoderModel and T5Model both have no heads)
    near = []  # architectures with the heads that load as another model: what they change
    for exact in (True, False):
        for architecture, theirs in specs.items():
            fits = set(theirs) == names if exact else names <= set(theirs) and set(theirs) - names <= set(
                family.optional)
            unlike = [n for n in sorted(names) if fits and theirs[n] != model.heads[n].spec]
            if unlike:
                first = unlike[0]
                near.append(_spec_change(architecture, first, theirs[first], model.heads[first].spec))
                continue
            loaded = _loads_as(family, hf, architecture) if fits else None
            if loaded == plain:
                return architecture
            if loaded is not None:
                near.append(f"{architecture} would load " + ", ".join(
                    f"{f.name}={getattr(loaded, f.name)!r} (this model: {getattr(plain, f.name)!r})"
                    for f in fields(plain) if getattr(loaded, f.name) != getattr(plain, f.name)))
    if near:  # the heads fit, the model does not: say why rather than blame the heads
        raise ConversionError(f"no Hugging Face architecture of this family holds this model exactly: "
                              f"{near[0]}")
    raise ConversionError(f"no Hugging Face architecture of this family has the heads {sorted(names)}")


def _label_fields(model: Transformer, labels: HeadLabels | None) -> dict:
    """The config fields naming a classifier's outputs: id2label (LABEL_i where no names are known), with
    label2id where they are, problem_type where one is known (the reference misreads a multilabel head
    as one softmax, a multi-output regression as classes, without it), and a CrossEncoder's activation as
    its sentence_transformers.activation_fn (without it sentence-transformers reads a sigmoid, lmforge no
    CrossEncoder)."""
    n = n_outputs(model)
    if n is None:
        return {}
    names = labels.names if labels is not None and labels.names and len(labels.names) == n else None
    fields = {"id2label": {str(i): names[i] if names else f"LABEL_{i}" for i in range(n)}}
    if names:
        fields["label2id"] = {name: i for i, name in enumerate(names)}
    if labels is not None and labels.problem_type:
        fields["problem_type"] = labels.problem_type
    if labels is not None and labels.activation:
        # one lmforge cannot score with (a Tanh) goes back as the class its folder named
        fields["sentence_transformers"] = {"activation_fn": ACTIVATION_FNS.get(labels.activation,
                                                                               labels.activation)}
    return fields


def save_hf(model: Transformer, path: str | Path, labels: HeadLabels | None = None) -> Path:
    """Write `model` as a Hugging Face directory that the reference `from_pretrained` loads; a classifier's
    outputs named by `labels` (io/labels.py: checked there to fit its head), else LABEL_i."""
    path = Path(path)
    cfg = model.config
    model_type, family = family_of(cfg)
    hf = {"model_type": model_type, **family.to_reference(cfg), **_label_fields(model, labels)}
    architecture = _architecture(family, model, hf)
    hf["architectures"] = [architecture]
    rules = expand(family.backbone(cfg), cfg.n_layers)
    for name, kind, _ in family.heads[architecture](hf):
        rules += family.head_rules(name, kind, cfg) if name in model.heads else []
    tensors = export_tensors(model.state_dict(), rules, _split_sizes(cfg))
    if family.fixed is not None:  # tensors the reference stores but lmforge computes or shares
        tensors.update(family.fixed(cfg, tensors))
    if architecture not in family.bare:  # task checkpoints keep the backbone under the family's prefix
        tensors = {k if re.fullmatch(family.head_keys, k) else family.prefix + k: v
                   for k, v in tensors.items()}
    path.mkdir(parents=True, exist_ok=True)
    save_tensors(tensors, path / "model.safetensors", {"format": "pt"})
    atomic_write_text(path / "config.json", json.dumps(hf, indent=2, ensure_ascii=False) + "\n")
    # a generator's own, always: where the file exists the reference (and load_hf) read generation's
    # special and forced tokens from it alone, so another model's left in the folder would be taken
    if cfg.architecture != "encoder":
        tokens = {name: getattr(cfg, name) for name in SPECIAL_TOKENS if getattr(cfg, name) is not None}
        atomic_write_text(path / "generation_config.json", json.dumps(tokens, indent=2) + "\n")
    return path
