"""XLNet (Yang et al. 2019) in the reference library's layout: model_type "xlnet".

The reference keeps every projection as a (d_model, n_heads, d_head) einsum operand;
the `heads_in` / `heads_out` fix-ups turn them into lmforge's Linear weights. The query
stream's start vector (mask_emb) is kept as `embed.query_init`; the query stream runs when
perm_mask / target_mapping are given (layers/variants/two_stream.py, objectives/plm.py).
"""
from __future__ import annotations

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert.family import (Family, activation_of, ffn_of, n_labels, special_tokens,
                                    special_tokens_of, tied_by_weights)
from lmforge.convert.keymap import Rule, linear
from lmforge.presets import XLNET

# reference options whose other values change the computation in ways lmforge does not express
REQUIRED = {"attn_type": "bi", "bi_data": False, "same_length": False, "untie_r": True}


def config(hf: dict) -> ModelConfig:
    """XLNetConfig fields -> ModelConfig."""
    for option, value in REQUIRED.items():
        if hf.get(option, value) != value:
            raise ConfigError(f"XLNet option {option}={hf[option]!r} is not supported (only {value!r})",
                              option)
    if (hf.get("clamp_len") or -1) > 0:
        raise ConfigError(f"XLNet option clamp_len={hf['clamp_len']} is not supported (only -1)", "clamp_len")
    return ModelConfig.from_dict(dict(
        XLNET, vocab_size=hf["vocab_size"], d_model=hf["d_model"], n_layers=hf["n_layer"],
        n_heads=hf["n_head"], d_ff=hf["d_inner"],
        ffn=ffn_of(hf.get("ff_activation", "gelu"), "ff_activation"),
        norm_eps=hf.get("layer_norm_eps", 1e-12), dropout=hf.get("dropout", 0.1),
        attention_dropout=hf.get("dropout", 0.1),
        # XLNet has no position table and the reference no length field (it refuses
        # max_position_embeddings); lmforge keeps its own limit under a namespaced key,
        # 512 (the pretraining length) when absent
        max_seq_len=hf.get("lmforge_max_seq_len", 512),
        tie_embeddings=hf.get("tie_word_embeddings", True), **special_tokens(hf)))


def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> XLNetConfig fields."""
    if cfg.attention_dropout != cfg.dropout:
        raise ConfigError("XLNet has one dropout rate for hidden states and attention", "attention_dropout")
    return dict(vocab_size=cfg.vocab_size, d_model=cfg.d_model, n_layer=cfg.n_layers, n_head=cfg.n_heads,
                d_inner=cfg.d_ff, ff_activation=activation_of(cfg.ffn), layer_norm_eps=cfg.norm_eps,
                dropout=cfg.dropout, lmforge_max_seq_len=cfg.max_seq_len,
                tie_word_embeddings=cfg.tie_embeddings, **special_tokens_of(cfg))


def backbone(cfg: ModelConfig) -> list:
    """Token table, query-stream start and the relative-attention layers."""
    layer, block = "layer.{i}", "encoder.blocks.{i}"
    H = (cfg.n_heads,)
    attn = f"{layer}.rel_attn"
    return [
        Rule("tokens.weight", ("word_embedding.weight",)),
        Rule("embed.query_init", ("mask_emb",)),
        Rule(f"{block}.attn.qkv.weight", tuple(f"{attn}.{p}" for p in "qkv"), "heads_in", H),
        Rule(f"{block}.attn.out.weight", (f"{attn}.o",), "heads_out", H),
        Rule(f"{block}.attn.xl.r_proj.weight", (f"{attn}.r",), "heads_in", H),
        *(Rule(f"{block}.attn.xl.{p}", (f"{attn}.{p}",)) for p in ("r_w_bias", "r_r_bias", "r_s_bias",
                                                                    "seg_embed")),
        *linear(f"{block}.attn_norm", f"{attn}.layer_norm"),
        *linear(f"{block}.ffn.up", f"{layer}.ff.layer_1"),
        *linear(f"{block}.ffn.down", f"{layer}.ff.layer_2"),
        *linear(f"{block}.ffn_norm", f"{layer}.ff.layer_norm"),
    ]


def head_rules(name: str, kind: str, cfg: ModelConfig) -> list:
    """Where each head's tensors live in an XLNet checkpoint."""
    h = f"heads.{name}"
    if kind == "lm":
        rules = [Rule(f"{h}.bias", ("lm_loss.bias",))]
        if not cfg.tie_embeddings:
            rules.append(Rule(f"{h}.decoder.weight", ("lm_loss.weight",)))
        return rules
    if kind == "classification":  # the sequence summary: last token, projection, tanh
        return [*linear(f"{h}.pooler.dense", "sequence_summary.summary"),
                *linear(f"{h}.classifier", "logits_proj")]
    if kind == "token-classification":
        return linear(f"{h}.classifier", "classifier")
    if kind == "span-qa":
        return linear(f"{h}.qa", "qa_outputs")
    raise ConfigError(f"head kind {kind!r} has no XLNet checkpoint layout", "kind")


# the one sequence summary lmforge's head computes: the last token, projected, tanh
SUMMARY = {"summary_type": "last", "summary_use_proj": True, "summary_activation": "tanh"}


def _summary(hf: dict) -> list:
    for field, value in SUMMARY.items():
        if hf.get(field, value) != value:
            raise ConfigError(f"{field}={hf[field]!r} is not supported: only XLNet's default sequence "
                              "summary (last token, projection, tanh)", field)
    return [("classification", "classification", {"n_labels": n_labels(hf), "pooling": "last"})]


FAMILY = Family(
    model_types=("xlnet",),
    prefix="transformer.",
    config=config,
    backbone=backbone,
    heads={
        "XLNetModel": lambda hf: [],
        "XLNetLMHeadModel": lambda hf: [("lm", "lm", {})],
        # the reference summarises the last position; lmforge the last real token (the same
        # under XLNet's left padding)
        "XLNetForSequenceClassification": _summary,
        "XLNetForTokenClassification": lambda hf: [("token-classification", "token-classification",
                                                    {"n_labels": n_labels(hf)})],
        "XLNetForQuestionAnsweringSimple": lambda hf: [("span-qa", "span-qa", {})],
    },
    head_rules=head_rules,
    to_reference=to_reference,
    bare=("XLNetModel",),
    head_keys=r"(lm_loss|sequence_summary|logits_proj|classifier|qa_outputs)\..*",
    ignore=(r"lm_loss\.weight",),  # the tied copy of the token table
    refine=tied_by_weights("word_embedding.weight", "lm_loss.weight"),
)
