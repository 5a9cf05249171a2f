"""ALBERT (Lan et al. 2020) in the reference library's layout: model_type "albert".

Factorised embeddings of size E projected up to d_model (sec. 3.1), and one layer shared
by every depth (sec. 3.1, cross-layer sharing). The reference's generalisation to several
groups of layers (num_hidden_groups, inner_group_num) is not lmforge's sharing: refused.
"""
from __future__ import annotations

from typing import Callable

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert.encoders import encoder_fields, reference_fields
from lmforge.convert.family import Family, n_labels, tied_by_weights
from lmforge.convert.keymap import Rule, linear
from lmforge.presets import ALBERT


def config(hf: dict) -> ModelConfig:
    """AlbertConfig fields -> ModelConfig."""
    for name in ("num_hidden_groups", "inner_group_num"):
        if hf.get(name, 1) != 1:
            raise ConfigError(f"{name}={hf[name]} is not supported: lmforge shares one layer across all "
                              "depths", name)
    E = hf.get("embedding_size", 128)
    # the reference projects E -> hidden_size even then; lmforge only when they differ
    if E == hf["hidden_size"]:
        raise ConfigError(f"embedding_size={E} equal to hidden_size is not supported", "embedding_size")
    return ModelConfig.from_dict({**ALBERT, **encoder_fields(hf, act="gelu_new", dropout=0.0), "d_embed": E,
                                  "max_seq_len": hf.get("max_position_embeddings", 512),
                                  "share_layers": True})


def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> AlbertConfig fields."""
    if not cfg.share_layers or cfg.embed_dim == cfg.d_model:
        raise ConfigError("ALBERT needs share_layers=True and a factorised embedding (d_embed != d_model)",
                          "share_layers" if not cfg.share_layers else "d_embed")
    return dict(reference_fields(cfg), embedding_size=cfg.embed_dim, max_position_embeddings=cfg.max_seq_len,
                num_hidden_groups=1, inner_group_num=1)


def backbone(cfg: ModelConfig) -> list:
    """Embeddings, the E -> d_model projection and the one shared layer."""
    layer, block = "encoder.albert_layer_groups.0.albert_layers.0", "encoder.blocks.0"
    qkv = [f"{layer}.attention.{p}" for p in ("query", "key", "value")]
    return [
        Rule("tokens.weight", ("embeddings.word_embeddings.weight",)),
        Rule("embed.positions.weight", ("embeddings.position_embeddings.weight",)),
        Rule("embed.segments.weight", ("embeddings.token_type_embeddings.weight",)),
        *linear("embed.norm", "embeddings.LayerNorm"),
        *linear("embed.project", "encoder.embedding_hidden_mapping_in"),
        Rule(f"{block}.attn.qkv.weight", tuple(f"{p}.weight" for p in qkv)),
        Rule(f"{block}.attn.qkv.bias", tuple(f"{p}.bias" for p in qkv)),
        *linear(f"{block}.attn.out", f"{layer}.attention.dense"),
        *linear(f"{block}.attn_norm", f"{layer}.attention.LayerNorm"),
        *linear(f"{block}.ffn.up", f"{layer}.ffn"),
        *linear(f"{block}.ffn.down", f"{layer}.ffn_output"),
        *linear(f"{block}.ffn_norm", f"{layer}.full_layer_layer_norm"),
    ]


def head_rules(name: str, kind: str, cfg: ModelConfig) -> list:
    """Where each head's tensors live in an ALBERT checkpoint."""
    h = f"heads.{name}"
    if kind == "lm":
        rules = [*linear(f"{h}.transform", "predictions.dense"),
                 *linear(f"{h}.norm", "predictions.LayerNorm"),
                 Rule(f"{h}.bias", ("predictions.bias",))]
        if not cfg.tie_embeddings:
            # untied, the reference ties nothing: the decoder's own bias is the one applied (the
            # later rule wins on import); export writes ours to both
            rules += [Rule(f"{h}.decoder.weight", ("predictions.decoder.weight",)),
                      Rule(f"{h}.bias", ("predictions.decoder.bias",), "clone")]
        return rules
    if kind == "pooler":
        return linear(f"{h}.dense", "pooler")
    if kind == "classification":  # sentence-order prediction or a task, on the tanh pooler
        classifier = "sop_classifier.classifier" if name == "sop" else "classifier"
        return [*linear(f"{h}.pooler.dense", "pooler"), *linear(f"{h}.classifier", classifier)]
    if kind == "token-classification":
        return linear(f"{h}.classifier", "classifier")
    if kind == "span-qa":
        return linear(f"{h}.qa", "qa_outputs")
    raise ConfigError(f"head kind {kind!r} has no ALBERT checkpoint layout", "kind")


def _labelled(kind: str) -> Callable:
    return lambda hf: [(kind, kind, {"n_labels": n_labels(hf)})]


FAMILY = Family(
    model_types=("albert",),
    prefix="albert.",
    config=config,
    backbone=backbone,
    heads={
        "AlbertModel": lambda hf: [("pooler", "pooler", {})],
        "AlbertForPreTraining": lambda hf: [("lm", "lm", {}),
                                            ("sop", "classification", {"n_labels": n_labels(hf)})],
        "AlbertForMaskedLM": lambda hf: [("lm", "lm", {})],
        "AlbertForSequenceClassification": _labelled("classification"),
        "AlbertForTokenClassification": _labelled("token-classification"),
        "AlbertForQuestionAnswering": lambda hf: [("span-qa", "span-qa", {})],
    },
    head_rules=head_rules,
    to_reference=to_reference,
    bare=("AlbertModel",),
    head_keys=r"(predictions|sop_classifier|classifier|qa_outputs)\..*",
    # position_ids buffers of old checkpoints; the tied decoder copies of the token table / bias
    ignore=(r"(.*\.)?position_ids", r"predictions\.decoder\.(weight|bias)"),
    refine=tied_by_weights("embeddings.word_embeddings.weight", "predictions.decoder.weight",
                           ("predictions.bias", "predictions.decoder.bias")),
)
