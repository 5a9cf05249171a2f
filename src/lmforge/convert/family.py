"""What a model family's converter declares: config mapping, key maps, heads per architecture."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from lmforge.config import SPECIAL_TOKENS, ConfigError
from lmforge.convert.keymap import Rule, linear
from lmforge.io.labels import n_labels
from lmforge.utils.errors import shown

# reference activation names -> lmforge ffn values (non-gated)
# gelu_python: the same exact (erf) GELU, written in Python
ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu-tanh",
               "gelu_pytorch_tanh": "gelu-tanh", "gelu_fast": "gelu-tanh", "relu": "relu"}


ACTIVATION_NAMES = {"gelu": "gelu", "gelu-tanh": "gelu_new", "relu": "relu"}


def activation_of(ffn: str) -> str:
    """The reference activation name of a (non-gated) lmforge feed-forward value."""
    if ffn not in ACTIVATION_NAMES:
        raise ConfigError(f"ffn={ffn!r} has no reference activation name for this family", "ffn")
    return ACTIVATION_NAMES[ffn]


def ffn_of(name: str, field: str = "hidden_act") -> str:
    """The lmforge feed-forward value of a reference activation name (`field`: the config's name for it)."""
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise ConfigError(f"{field}={name!r} is not supported; known activations: {', '.join(ACTIVATIONS)}",
                          field)
    return ACTIVATIONS[name]


def flag(hf: dict, name: str, default: bool) -> bool:
    """A true/false field of a reference config, `default` where absent or null; anything else is refused
    naming it, as the reference refuses it (the string "false" was read as true, tested `is not False`)."""
    value = hf.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {shown(value)}", name)
    return value


def special_tokens(hf: dict) -> dict:
    """The reference config's pad/bos/eos/decoder-start ids as ModelConfig fields (a list -> its first)."""
    out = {}
    for name in SPECIAL_TOKENS:
        value = hf.get(name)
        out[name] = value[0] if isinstance(value, list) and value else value
    return out


def special_tokens_of(cfg) -> dict:
    """The inverse: ModelConfig's special token ids as reference config fields, unset ones written as null:
    left out, the reference class's defaults stood in (a Llama's eos 2, GPT-2's bos/eos 50256, BART's
    decoder start 2), which its pipelines used and its save_pretrained wrote back for lmforge to read."""
    return {name: getattr(cfg, name) for name in SPECIAL_TOKENS}


def tied_by_weights(table: str, head: str, biases: tuple = ()) -> Callable:
    """A `refine` that ties the LM head as the reference loader does: as the config says, unless the
    checkpoint holds its own `head` matrix that differs from the token `table` (configs alone can be
    wrong here). A config that says untied stays so, head stored or not: a bare model or a classifier
    keeps the architecture it was trained with (an LM head attached later, and its export, untied).
    `biases`: (the head's bias, the decoder's copy of it), one tensor when tied: a stored copy
    that differs is what the reference then applies, and is refused."""
    def refine(cfg, tensors: dict):
        untied = head in tensors and not torch.equal(tensors[head], tensors.get(table, tensors[head]))
        tied = cfg.tie_embeddings and not untied
        if biases and tied:
            check_copies(tensors, biases[0], biases[1:], "LM-head bias")
        return cfg.replace(tie_embeddings=tied)
    return refine


# an encoder-decoder's stacks' own names for the one token table, `shared` (T5, BART)
STACK_TABLES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


def tied_with_stack_tables(cfg, tensors: dict):
    """The `refine` of T5 and BART: stack token tables that differ from `shared`, which the reference then
    reads (tie_word_embeddings=false, or stored apart), are refused; the LM head tied as tied_by_weights
    ties it."""
    check_copies(tensors, "shared.weight", STACK_TABLES)
    return tied_by_weights("shared.weight", "lm_head.weight")(cfg, tensors)


def check_copies(tensors: dict, source: str, copies: tuple, what: str = "token table") -> None:
    """Refuse stored `copies` of `source` that differ from it: the reference loader then keeps them
    apart and computes with the copy, where lmforge has one `what`."""
    for name in copies:
        if name in tensors and source in tensors and not torch.equal(tensors[name], tensors[source]):
            raise ConfigError(f"the checkpoint's {name} differs from {source}: lmforge has one {what} "
                              "where the reference would keep both", name)


def decoder_task_heads(prefix: str, qa: bool = True) -> dict:
    """The reference's {prefix}ForSequenceClassification (the score of the last real token, without
    a bias: GPT's [EXTRACT]), ForTokenClassification and (qa) ForQuestionAnswering architectures."""
    heads = {
        f"{prefix}ForSequenceClassification": lambda hf: [
            ("classification", "classification",
             {"n_labels": n_labels(hf), "pooling": "last", "pooler": False, "bias": False})],
        f"{prefix}ForTokenClassification": lambda hf: [
            ("token-classification", "token-classification", {"n_labels": n_labels(hf)})],
    }
    if qa:
        heads[f"{prefix}ForQuestionAnswering"] = lambda hf: [("span-qa", "span-qa", {})]
    return heads


def decoder_head_rules(family: str, token_labels: str = "classifier") -> Callable:
    """head_rules of a decoder family whose LM head is the tied token table (an untied one is
    `lm_head`), sequence scores `score` (no bias), token labels `token_labels` (Llama's: `score`
    too, with a bias), answer spans `qa_outputs`."""
    def rules(name: str, kind: str, cfg) -> list:
        h = f"heads.{name}"
        if kind == "lm":
            return [] if cfg.tie_embeddings else [Rule(f"{h}.decoder.weight", ("lm_head.weight",))]
        if kind == "classification":
            return [Rule(f"{h}.classifier.weight", ("score.weight",))]
        if kind == "token-classification":
            return linear(f"{h}.classifier", token_labels)
        if kind == "span-qa":
            return linear(f"{h}.qa", "qa_outputs")
        raise ConfigError(f"head kind {kind!r} has no {family} checkpoint layout", "kind")
    return rules


@dataclass
class Family:
    """One reference family: how its config and weights map onto lmforge."""

    model_types: tuple  # the reference config's "model_type" values
    prefix: str  # backbone prefix inside task checkpoints ("bert.", "transformer.")
    config: Callable  # reference config dict -> ModelConfig
    backbone: Callable  # ModelConfig -> list[Rule] (lmforge names <- reference names)
    heads: dict  # reference architecture -> (reference config -> [(head name, kind, args)])
    head_rules: Callable  # (head name, kind, ModelConfig) -> list[Rule]
    to_reference: Callable  # ModelConfig -> reference config dict (the inverse of `config`)
    head_keys: str  # regex of the reference names that sit outside the backbone prefix
    bare: tuple  # architectures whose checkpoints have no backbone prefix
    ignore: tuple = field(default_factory=tuple)  # regexes of reference tensors with no lmforge place
    refine: Optional[Callable] = None  # (ModelConfig, reference tensors) -> ModelConfig: what weights tell
    # (ModelConfig, the exported reference tensors) -> {reference name: tensor} stored there, not here
    fixed: Optional[Callable] = None
    # heads a checkpoint of the architecture may lack (a BertModel saved with add_pooling_layer=False)
    optional: tuple = ("pooler",)
