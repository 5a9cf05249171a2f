"""ELECTRA (Clark et al. 2020) in the reference library's layout: model_type "electra".

A BERT encoder whose embeddings may be narrower (embedding_size E) and projected up
(embeddings_project). The discriminator's head scores each token as replaced or not
(kind "rtd"); the generator is a masked LM whose transform maps to E and always applies
gelu; sentence classification is dense + gelu + out_proj on the first token, lmforge's
pooler with pooler_activation="gelu".
"""
from __future__ import annotations

from typing import Callable

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert import bert
from lmforge.convert.encoders import encoder_fields, reference_fields
from lmforge.convert.family import Family, n_labels, tied_by_weights
from lmforge.convert.keymap import Rule, linear
from lmforge.presets import ELECTRA


def config(hf: dict) -> ModelConfig:
    """ElectraConfig fields -> ModelConfig."""
    fields = encoder_fields(hf)
    E = hf.get("embedding_size", 128)
    return ModelConfig.from_dict({**ELECTRA, **fields, "d_embed": E if E != fields["d_model"] else None,
                                  "max_seq_len": hf.get("max_position_embeddings", 512),
                                  "lm_activation": "gelu"})


def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> ElectraConfig fields."""
    return dict(reference_fields(cfg), embedding_size=cfg.embed_dim, max_position_embeddings=cfg.max_seq_len)


def backbone(cfg: ModelConfig) -> list:
    """BERT's embeddings and layers, and the E -> d_model projection where E differs."""
    project = linear("embed.project", "embeddings_project") if cfg.embed_dim != cfg.d_model else []
    return [*bert.backbone(cfg), *project]


def head_rules(name: str, kind: str, cfg: ModelConfig) -> list:
    """Where each head's tensors live in an ELECTRA checkpoint."""
    h = f"heads.{name}"
    if kind == "rtd":
        return [*linear(f"{h}.dense", "discriminator_predictions.dense"),
                *linear(f"{h}.score", "discriminator_predictions.dense_prediction")]
    if kind == "lm":
        rules = [*linear(f"{h}.transform", "generator_predictions.dense"),
                 *linear(f"{h}.norm", "generator_predictions.LayerNorm"),
                 Rule(f"{h}.bias", ("generator_lm_head.bias",))]
        if not cfg.tie_embeddings:
            rules.append(Rule(f"{h}.decoder.weight", ("generator_lm_head.weight",)))
        return rules
    if kind == "classification":  # dense + gelu + out_proj on [CLS]: the pooler and classifier
        return [*linear(f"{h}.pooler.dense", "classifier.dense"),
                *linear(f"{h}.classifier", "classifier.out_proj")]
    if kind == "token-classification":
        return linear(f"{h}.classifier", "classifier")
    if kind == "span-qa":
        return linear(f"{h}.qa", "qa_outputs")
    raise ConfigError(f"head kind {kind!r} has no ELECTRA checkpoint layout", "kind")


def _labelled(kind: str) -> Callable:
    return lambda hf: [(kind, kind, {"n_labels": n_labels(hf)})]


FAMILY = Family(
    model_types=("electra",),
    prefix="electra.",
    config=config,
    backbone=backbone,
    heads={
        "ElectraModel": lambda hf: [],
        "ElectraForPreTraining": lambda hf: [("rtd", "rtd", {})],
        "ElectraForMaskedLM": lambda hf: [("lm", "lm", {})],
        "ElectraForSequenceClassification": _labelled("classification"),
        "ElectraForTokenClassification": _labelled("token-classification"),
        "ElectraForQuestionAnswering": lambda hf: [("span-qa", "span-qa", {})],
    },
    head_rules=head_rules,
    to_reference=to_reference,
    bare=("ElectraModel",),
    head_keys=(r"(discriminator_predictions|generator_predictions|generator_lm_head|classifier|qa_outputs)"
               r"\..*"),
    # position_ids buffers of old checkpoints; the tied copy of the token table
    ignore=(r"(.*\.)?position_ids", r"generator_lm_head\.weight"),
    refine=tied_by_weights("embeddings.word_embeddings.weight", "generator_lm_head.weight"),
)
