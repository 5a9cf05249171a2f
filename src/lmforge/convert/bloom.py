"""BLOOM (BigScience 2022) in the reference library's layout: model_type "bloom".

ALiBi instead of position embeddings, a LayerNorm on the word embeddings, pre-norm blocks
with a final norm, tanh-GELU and a feed-forward width fixed at 4 d_model. The reference
fuses q, k and v per head, rows (n_heads, 3, d_head); the `qkv_per_head` fix-up regroups
them into lmforge's [q; k; v] and back. ALiBi needs no length, so the config's
`seq_length` (the training length, 2048) only sets max_seq_len.
"""
from __future__ import annotations

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert.family import (Family, decoder_head_rules, decoder_task_heads, special_tokens,
                                    special_tokens_of, tied_by_weights)
from lmforge.convert.keymap import Rule, linear
from lmforge.presets import BLOOM


def config(hf: dict) -> ModelConfig:
    """BloomConfig fields -> ModelConfig."""
    if hf.get("apply_residual_connection_post_layernorm"):
        raise ConfigError("BLOOM option apply_residual_connection_post_layernorm=true is not supported",
                          "apply_residual_connection_post_layernorm")
    if hf.get("slow_but_exact") and (hf.get("pretraining_tp") or 1) > 1:
        # the reference's sliced output projections then drop their biases
        raise ConfigError(f"BLOOM option slow_but_exact=true with pretraining_tp={hf['pretraining_tp']} "
                          "is not supported", "slow_but_exact")
    d_model = hf.get("hidden_size") or hf["n_embed"]
    return ModelConfig.from_dict(dict(
        BLOOM, vocab_size=hf["vocab_size"], d_model=d_model, n_layers=hf["n_layer"], n_heads=hf["n_head"],
        d_ff=4 * d_model, max_seq_len=hf.get("seq_length") or BLOOM["max_seq_len"],
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), dropout=hf.get("hidden_dropout", 0.0),
        attention_dropout=hf.get("attention_dropout", 0.0),
        tie_embeddings=hf.get("tie_word_embeddings", True), **special_tokens(hf)))


def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> BloomConfig fields (`family_of` checks that they express `cfg` exactly)."""
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, n_layer=cfg.n_layers, n_head=cfg.n_heads,
                seq_length=cfg.max_seq_len, layer_norm_epsilon=cfg.norm_eps, hidden_dropout=cfg.dropout,
                attention_dropout=cfg.attention_dropout, tie_word_embeddings=cfg.tie_embeddings,
                **special_tokens_of(cfg))


def backbone(cfg: ModelConfig) -> list:
    """Word embeddings and their norm, blocks (per-head fused qkv regrouped) and the final norm."""
    layer, block = "h.{i}", "decoder.blocks.{i}"
    qkv = f"{layer}.self_attention.query_key_value"
    return [
        Rule("tokens.weight", ("word_embeddings.weight",)),
        *linear("embed.norm", "word_embeddings_layernorm"),
        *linear(f"{block}.attn_norm", f"{layer}.input_layernorm"),
        Rule(f"{block}.attn.qkv.weight", (f"{qkv}.weight",), "qkv_per_head", (cfg.n_heads,)),
        Rule(f"{block}.attn.qkv.bias", (f"{qkv}.bias",), "qkv_per_head", (cfg.n_heads,)),
        *linear(f"{block}.attn.out", f"{layer}.self_attention.dense"),
        *linear(f"{block}.ffn_norm", f"{layer}.post_attention_layernorm"),
        *linear(f"{block}.ffn.up", f"{layer}.mlp.dense_h_to_4h"),
        *linear(f"{block}.ffn.down", f"{layer}.mlp.dense_4h_to_h"),
        *linear("decoder.final_norm", "ln_f"),
    ]


FAMILY = Family(
    model_types=("bloom",),
    prefix="transformer.",
    config=config,
    backbone=backbone,
    heads={
        "BloomModel": lambda hf: [],
        "BloomForCausalLM": lambda hf: [("lm", "lm", {})],
        **decoder_task_heads("Bloom"),
    },
    head_rules=decoder_head_rules("BLOOM"),
    to_reference=to_reference,
    bare=("BloomModel",),
    head_keys=r"(lm_head|score|classifier|qa_outputs)\..*",
    ignore=(r"lm_head\.weight",),  # the tied copy of the token table
    refine=tied_by_weights("word_embeddings.weight", "lm_head.weight"),
)
