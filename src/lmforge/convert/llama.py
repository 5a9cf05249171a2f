"""Llama (Touvron et al. 2023) in the reference library's layout: model_type "llama".

Pre-norm RMSNorm blocks, rotary positions (rotate-half layout, as `apply_rotary`; unscaled,
linear or llama3 frequency scaling), SwiGLU and grouped-query attention. The reference keeps q, k
and v as three Linear layers; lmforge fuses them into one `qkv` whose rows are [q; k; v] (n_heads,
n_kv_heads, n_kv_heads heads).
Mistral (mistral.py) is this layout plus a sliding window, so the pieces here take the
reference's option names as arguments rather than assuming Llama's.
"""
from __future__ import annotations

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert.family import (Family, decoder_head_rules, decoder_task_heads, special_tokens,
                                    special_tokens_of, tied_by_weights)
from lmforge.convert.keymap import Rule
from lmforge.presets import LLAMA
from lmforge.utils.errors import shown


def _rope_params(hf: dict) -> tuple:
    """(the RoPE mapping the reference reads, the config field it came from). As the reference: a non-empty
    `rope_scaling` replaces `rope_parameters` whole (an older recipe adds it to a newer file), and a
    top-level `rope_theta` or `partial_rotary_factor` fills in what that mapping lacks."""
    field = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    params = hf.get(field) or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{field} must be a mapping {{rope_type: ..., ...}}, got {shown(params)}", field)
    params = {"rope_theta": hf.get("rope_theta", 10000.0), **params}
    if hf.get("partial_rotary_factor") is not None:
        params.setdefault("partial_rotary_factor", hf["partial_rotary_factor"])
    return params, field


def _number(params: dict, key: str, field: str) -> float:
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{field}'s {key} must be a number, got {shown(value)}", field)
    return float(value)


def rope(hf: dict) -> dict:
    """RoPE fields from `rope_parameters` (transformers 5) or `rope_theta` / `rope_scaling` (older files).

    Unscaled, linear and llama3 scaling are expressible; other types (dynamic NTK, YaRN, ...)
    change attention itself and are refused rather than silently dropped."""
    params, field = _rope_params(hf)
    kind = params.get("rope_type", params.get("type", "default"))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError(f"partial_rotary_factor={params['partial_rotary_factor']} is not supported",
                          "partial_rotary_factor")
    fields = {"rotary_theta": _number(params, "rope_theta", field)}
    if kind == "default":
        return fields
    if kind not in ("linear", "llama3"):
        raise ConfigError(f"{field}: rope_scaling of type {kind!r} is not supported "
                          "(default, linear, llama3)", field)
    fields.update(rotary_scaling=kind, rotary_scaling_factor=_number(params, "factor", field))
    if kind == "llama3":
        fields.update(rotary_low_freq_factor=_number(params, "low_freq_factor", field),
                      rotary_high_freq_factor=_number(params, "high_freq_factor", field),
                      rotary_original_max_len=params.get("original_max_position_embeddings",
                                                         hf["max_position_embeddings"]))
    return fields


def rope_parameters(cfg: ModelConfig) -> dict:
    """The inverse of `rope`: the reference's `rope_parameters` of a rotary ModelConfig."""
    params = {"rope_type": "default" if cfg.rotary_scaling == "none" else cfg.rotary_scaling,
              "rope_theta": cfg.rotary_theta}
    if cfg.rotary_scaling != "none":
        params["factor"] = cfg.rotary_scaling_factor
    if cfg.rotary_scaling == "llama3":
        params.update(low_freq_factor=cfg.rotary_low_freq_factor,
                      high_freq_factor=cfg.rotary_high_freq_factor,
                      original_max_position_embeddings=cfg.rotary_original_max_len)
    return params


def decoder_config(hf: dict, **fields) -> ModelConfig:
    """The fields every Llama-layout config shares -> ModelConfig (`fields` add or override)."""
    if hf.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ConfigError(f"hidden_act={hf['hidden_act']!r} is not supported (SwiGLU needs silu)",
                          "hidden_act")
    # pretraining_tp > 1 only sliced the same products in older references (this one ignores it): read as 1
    d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    n_kv = hf.get("num_key_value_heads") or n_heads
    d_head = hf.get("head_dim") or d_model // n_heads
    return ModelConfig.from_dict(dict(
        LLAMA, vocab_size=hf["vocab_size"], d_model=d_model, n_layers=hf["num_hidden_layers"],
        n_heads=n_heads, n_kv_heads=None if n_kv == n_heads else n_kv,
        d_head=None if d_head * n_heads == d_model else d_head, d_ff=hf["intermediate_size"],
        max_seq_len=hf["max_position_embeddings"], norm_eps=hf.get("rms_norm_eps", 1e-6),
        attention_dropout=hf.get("attention_dropout", 0.0),
        tie_embeddings=hf.get("tie_word_embeddings", False), **rope(hf), **special_tokens(hf), **fields))


def config(hf: dict) -> ModelConfig:
    """LlamaConfig fields -> ModelConfig."""
    return decoder_config(hf, attention_bias=hf.get("attention_bias", False),
                          ffn_bias=hf.get("mlp_bias", False))


def decoder_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> the fields every Llama-layout config shares."""
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                intermediate_size=cfg.d_ff, max_position_embeddings=cfg.max_seq_len, hidden_act="silu",
                rms_norm_eps=cfg.norm_eps, rope_parameters=rope_parameters(cfg),
                attention_dropout=cfg.attention_dropout, tie_word_embeddings=cfg.tie_embeddings,
                **special_tokens_of(cfg))


def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> LlamaConfig fields (`family_of` checks that they express `cfg` exactly)."""
    return dict(decoder_reference(cfg), attention_bias=cfg.attention_bias, mlp_bias=cfg.ffn_bias)


def _projection(ours: str, theirs: str, bias: bool) -> list:
    """A Linear's weight, and its bias where the config has one."""
    rules = [Rule(f"{ours}.weight", (f"{theirs}.weight",))]
    return rules + [Rule(f"{ours}.bias", (f"{theirs}.bias",))] if bias else rules


def backbone(cfg: ModelConfig) -> list:
    """Token table, blocks (q, k, v concatenated into qkv) and the final RMSNorm."""
    layer, block = "layers.{i}", "decoder.blocks.{i}"
    qkv = tuple(f"{layer}.self_attn.{p}_proj" for p in "qkv")
    rules = [Rule("tokens.weight", ("embed_tokens.weight",)),
             Rule(f"{block}.attn.qkv.weight", tuple(f"{p}.weight" for p in qkv))]
    if cfg.attention_bias:
        rules.append(Rule(f"{block}.attn.qkv.bias", tuple(f"{p}.bias" for p in qkv)))
    return rules + [
        *_projection(f"{block}.attn.out", f"{layer}.self_attn.o_proj", cfg.attention_bias),
        Rule(f"{block}.attn_norm.weight", (f"{layer}.input_layernorm.weight",)),
        Rule(f"{block}.ffn_norm.weight", (f"{layer}.post_attention_layernorm.weight",)),
        *_projection(f"{block}.ffn.gate", f"{layer}.mlp.gate_proj", cfg.ffn_bias),
        *_projection(f"{block}.ffn.up", f"{layer}.mlp.up_proj", cfg.ffn_bias),
        *_projection(f"{block}.ffn.down", f"{layer}.mlp.down_proj", cfg.ffn_bias),
        Rule("decoder.final_norm.weight", ("norm.weight",)),
    ]


# LM head `lm_head` (absent when tied); sequence scores and token labels both live in `score`
head_rules = decoder_head_rules("Llama-layout", token_labels="score")


def decoder_heads(prefix: str) -> dict:
    """Architectures `{prefix}Model`, `ForCausalLM`, `ForSequenceClassification` (the score of the
    last real token, no bias) and `ForTokenClassification`."""
    return {f"{prefix}Model": lambda hf: [], f"{prefix}ForCausalLM": lambda hf: [("lm", "lm", {})],
            **decoder_task_heads(prefix, qa=False)}


FAMILY = Family(
    model_types=("llama",),
    prefix="model.",
    config=config,
    backbone=backbone,
    heads=decoder_heads("Llama"),
    head_rules=head_rules,
    to_reference=to_reference,
    bare=("LlamaModel",),
    head_keys=r"(lm_head|score)\..*",
    # rotary caches of old checkpoints; the tied copy of the token table
    ignore=(r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"lm_head\.weight"),
    refine=tied_by_weights("embed_tokens.weight", "lm_head.weight"),
)
