"""BERT (Devlin et al. 2019) in the reference library's layout: model_type "bert"."""
from __future__ import annotations

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert.encoders import check_encoder
from lmforge.convert.family import (Family, activation_of, ffn_of, n_labels, special_tokens,
                                    special_tokens_of, tied_by_weights)
from lmforge.convert.keymap import Rule, linear
from lmforge.presets import BERT


def config(hf: dict) -> ModelConfig:
    """BertConfig fields -> ModelConfig."""
    check_encoder(hf)  # a decoder (is_decoder: causal self-attention) is refused, not loaded bidirectional
    return ModelConfig.from_dict(dict(
        BERT, vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
        max_seq_len=hf["max_position_embeddings"], n_segments=hf.get("type_vocab_size", 2),
        norm_eps=hf.get("layer_norm_eps", 1e-12), ffn=ffn_of(hf.get("hidden_act", "gelu")),
        dropout=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        tie_embeddings=hf.get("tie_word_embeddings", True), **special_tokens(hf)))



def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> BertConfig fields."""
    if cfg.n_segments < 1:  # the reference always adds token-type embeddings (DistilBERT has none)
        raise ConfigError("BERT needs n_segments >= 1", "n_segments")
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_ff,
                max_position_embeddings=cfg.max_seq_len, type_vocab_size=cfg.n_segments,
                layer_norm_eps=cfg.norm_eps, hidden_act=activation_of(cfg.ffn),
                hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attention_dropout,
                tie_word_embeddings=cfg.tie_embeddings, **special_tokens_of(cfg))


def backbone(cfg: ModelConfig) -> list:
    """Embeddings and encoder layers."""
    layer, block = "encoder.layer.{i}", "encoder.blocks.{i}"
    qkv = [f"{layer}.attention.self.{p}" for p in ("query", "key", "value")]
    return [
        Rule("tokens.weight", ("embeddings.word_embeddings.weight",)),
        Rule("embed.positions.weight", ("embeddings.position_embeddings.weight",)),
        Rule("embed.segments.weight", ("embeddings.token_type_embeddings.weight",)),
        *linear("embed.norm", "embeddings.LayerNorm"),
        Rule(f"{block}.attn.qkv.weight", tuple(f"{p}.weight" for p in qkv)),
        Rule(f"{block}.attn.qkv.bias", tuple(f"{p}.bias" for p in qkv)),
        *linear(f"{block}.attn.out", f"{layer}.attention.output.dense"),
        *linear(f"{block}.attn_norm", f"{layer}.attention.output.LayerNorm"),
        *linear(f"{block}.ffn.up", f"{layer}.intermediate.dense"),
        *linear(f"{block}.ffn.down", f"{layer}.output.dense"),
        *linear(f"{block}.ffn_norm", f"{layer}.output.LayerNorm"),
    ]


def head_rules(name: str, kind: str, cfg: ModelConfig) -> list:
    """Where each head's tensors live in a BERT checkpoint."""
    h = f"heads.{name}"
    if kind == "lm":
        rules = [*linear(f"{h}.transform", "cls.predictions.transform.dense"),
                 *linear(f"{h}.norm", "cls.predictions.transform.LayerNorm"),
                 Rule(f"{h}.bias", ("cls.predictions.bias",))]
        if not cfg.tie_embeddings:
            # untied, the reference ties nothing: the decoder's own bias is the one applied (the
            # later rule wins on import); export writes ours to both names
            rules += [Rule(f"{h}.decoder.weight", ("cls.predictions.decoder.weight",)),
                      Rule(f"{h}.bias", ("cls.predictions.decoder.bias",), "clone")]
        return rules
    if kind == "pooler":
        return linear(f"{h}.dense", "pooler.dense")
    if name == "nsp":
        return [*linear(f"{h}.pooler.dense", "pooler.dense"),
                *linear(f"{h}.classifier", "cls.seq_relationship")]
    if kind == "classification":
        return [*linear(f"{h}.pooler.dense", "pooler.dense"), *linear(f"{h}.classifier", "classifier")]
    if kind == "token-classification":
        return linear(f"{h}.classifier", "classifier")
    if kind == "span-qa":
        return linear(f"{h}.qa", "qa_outputs")
    raise ConfigError(f"head kind {kind!r} has no BERT checkpoint layout", "kind")


FAMILY = Family(
    model_types=("bert",),
    prefix="bert.",
    config=config,
    backbone=backbone,
    heads={
        "BertModel": lambda hf: [("pooler", "pooler", {})],
        "BertForMaskedLM": lambda hf: [("lm", "lm", {})],
        "BertForPreTraining": lambda hf: [("lm", "lm", {}), ("nsp", "classification", {"n_labels": 2})],
        "BertForSequenceClassification": lambda hf: [("classification", "classification",
                                                      {"n_labels": n_labels(hf)})],
        "BertForTokenClassification": lambda hf: [("token-classification", "token-classification",
                                                   {"n_labels": n_labels(hf)})],
        "BertForQuestionAnswering": lambda hf: [("span-qa", "span-qa", {})],
    },
    head_rules=head_rules,
    to_reference=to_reference,
    bare=("BertModel",),
    head_keys=r"(cls|classifier|qa_outputs)\..*",
    # position_ids buffers of old checkpoints; the tied decoder copies of the token table / bias
    ignore=(r"(.*\.)?position_ids", r"cls\.predictions\.decoder\.(weight|bias)"),
    refine=tied_by_weights("embeddings.word_embeddings.weight", "cls.predictions.decoder.weight",
                           ("cls.predictions.bias", "cls.predictions.decoder.bias")),
)
