"""DistilBERT (Sanh et al. 2019) in the reference library's layout: model_type "distilbert".

A BERT encoder without segments, its norm epsilon fixed at 1e-12. With
sinusoidal_pos_embds the reference fills its position table with sinusoids (Vaswani et
al. 2017) and still stores it; lmforge computes them (position="sinusoidal"), checks
the stored table on import and writes it on export. The reference in fact keeps that
table trainable, so a checkpoint whose table is no longer the sinusoids loads as
learned positions, which is what it then is.

Dropout differs in training only: the reference drops nothing after the attention
output projection, lmforge's block does.
"""
from __future__ import annotations

from typing import Callable

import torch

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert.family import (Family, activation_of, ffn_of, n_labels, special_tokens,
                                    special_tokens_of, tied_by_weights)
from lmforge.convert.keymap import Rule, linear
from lmforge.presets import BERT

POSITIONS = "embeddings.position_embeddings.weight"
NORM_EPS = 1e-12  # hard-coded in the reference


def config(hf: dict) -> ModelConfig:
    """DistilBertConfig fields -> ModelConfig."""
    return ModelConfig.from_dict({
        **BERT, "vocab_size": hf["vocab_size"], "d_model": hf["dim"], "n_layers": hf["n_layers"],
        "n_heads": hf["n_heads"], "d_ff": hf["hidden_dim"],
        "max_seq_len": hf.get("max_position_embeddings", 512),
        "n_segments": 0, "position": "sinusoidal" if hf.get("sinusoidal_pos_embds") else "learned",
        "norm_eps": NORM_EPS, "ffn": ffn_of(hf.get("activation", "gelu"), "activation"),
        "dropout": hf.get("dropout", 0.1),
        "attention_dropout": hf.get("attention_dropout", 0.1), "pooler_activation": "relu",
        "tie_embeddings": hf.get("tie_word_embeddings", True), **special_tokens(hf)})


def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> DistilBertConfig fields."""
    if cfg.position not in ("learned", "sinusoidal"):
        raise ConfigError(f"DistilBERT has learned or sinusoidal positions, not {cfg.position!r}", "position")
    return dict(vocab_size=cfg.vocab_size, dim=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                hidden_dim=cfg.d_ff, max_position_embeddings=cfg.max_seq_len,
                sinusoidal_pos_embds=cfg.position == "sinusoidal", activation=activation_of(cfg.ffn),
                dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
                tie_word_embeddings=cfg.tie_embeddings, **special_tokens_of(cfg))


def sinusoids(n_positions: int, dim: int) -> torch.Tensor:
    """The reference's table, PE[p, j] = sin|cos(p / 10000^(2 floor(j/2) / dim)), rounded as it rounds
    (float64, then float32), so an export writes the same bits."""
    j = torch.arange(dim, dtype=torch.float64)
    angle = torch.arange(n_positions, dtype=torch.float64)[:, None] / 10000.0 ** (2 * (j // 2) / dim)
    return torch.where(j % 2 == 0, angle.sin(), angle.cos()).float()  # (n_positions, dim)


def fixed(cfg: ModelConfig, tensors: dict | None = None) -> dict:
    """The sinusoid table the reference stores and lmforge computes (`tensors`: the export's, unused)."""
    return {POSITIONS: sinusoids(cfg.max_seq_len, cfg.d_model)} if cfg.position == "sinusoidal" else {}


def refine(cfg: ModelConfig, tensors: dict) -> ModelConfig:
    """Tie as the reference loader does; a sinusoid table that has been trained is a learned one."""
    cfg = tied_by_weights("embeddings.word_embeddings.weight", "vocab_projector.weight")(cfg, tensors)
    stored = tensors.get(POSITIONS)
    expected = fixed(cfg).get(POSITIONS)
    if expected is not None and stored is not None and not (
            stored.shape == expected.shape and torch.allclose(stored.float(), expected, atol=1e-6)):
        cfg = cfg.replace(position="learned")
    return cfg


def backbone(cfg: ModelConfig) -> list:
    """Embeddings (positions only when learned) and the transformer layers."""
    layer, block = "transformer.layer.{i}", "encoder.blocks.{i}"
    qkv = [f"{layer}.attention.{p}_lin" for p in ("q", "k", "v")]
    rules = [
        Rule("tokens.weight", ("embeddings.word_embeddings.weight",)),
        *linear("embed.norm", "embeddings.LayerNorm"),
        Rule(f"{block}.attn.qkv.weight", tuple(f"{p}.weight" for p in qkv)),
        Rule(f"{block}.attn.qkv.bias", tuple(f"{p}.bias" for p in qkv)),
        *linear(f"{block}.attn.out", f"{layer}.attention.out_lin"),
        *linear(f"{block}.attn_norm", f"{layer}.sa_layer_norm"),
        *linear(f"{block}.ffn.up", f"{layer}.ffn.lin1"),
        *linear(f"{block}.ffn.down", f"{layer}.ffn.lin2"),
        *linear(f"{block}.ffn_norm", f"{layer}.output_layer_norm"),
    ]
    if cfg.position == "learned":
        rules.append(Rule("embed.positions.weight", (POSITIONS,)))
    return rules


def head_rules(name: str, kind: str, cfg: ModelConfig) -> list:
    """Where each head's tensors live in a DistilBERT checkpoint."""
    h = f"heads.{name}"
    if kind == "lm":
        rules = [*linear(f"{h}.transform", "vocab_transform"), *linear(f"{h}.norm", "vocab_layer_norm"),
                 Rule(f"{h}.bias", ("vocab_projector.bias",))]
        if not cfg.tie_embeddings:
            rules.append(Rule(f"{h}.decoder.weight", ("vocab_projector.weight",)))
        return rules
    if kind == "classification":  # pre_classifier + relu on [CLS]: the pooler with pooler_activation="relu"
        return [*linear(f"{h}.pooler.dense", "pre_classifier"), *linear(f"{h}.classifier", "classifier")]
    if kind == "token-classification":
        return linear(f"{h}.classifier", "classifier")
    if kind == "span-qa":
        return linear(f"{h}.qa", "qa_outputs")
    raise ConfigError(f"head kind {kind!r} has no DistilBERT checkpoint layout", "kind")


def _labelled(kind: str) -> Callable:
    return lambda hf: [(kind, kind, {"n_labels": n_labels(hf)})]


FAMILY = Family(
    model_types=("distilbert",),
    prefix="distilbert.",
    config=config,
    backbone=backbone,
    heads={
        "DistilBertModel": lambda hf: [],
        "DistilBertForMaskedLM": lambda hf: [("lm", "lm", {})],
        "DistilBertForSequenceClassification": _labelled("classification"),
        "DistilBertForTokenClassification": _labelled("token-classification"),
        "DistilBertForQuestionAnswering": lambda hf: [("span-qa", "span-qa", {})],
    },
    head_rules=head_rules,
    to_reference=to_reference,
    bare=("DistilBertModel",),
    head_keys=r"(vocab_transform|vocab_layer_norm|vocab_projector|pre_classifier|classifier|qa_outputs)\..*",
    # position_ids buffers; the tied copy of the token table; the sinusoids lmforge computes
    ignore=(r"(.*\.)?position_ids", r"vocab_projector\.weight", r"embeddings\.position_embeddings\.weight"),
    refine=refine,
    fixed=fixed,
)
