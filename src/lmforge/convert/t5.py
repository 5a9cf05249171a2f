"""T5 (Raffel et al. 2020) and T5 v1.1 in the reference library's layout: model_type "t5".

v1.0: ReLU feed-forward, LM head tied to the token table with the d_model**-0.5 logit scale.
v1.1: gated-GELU (tanh) feed-forward, its own LM head, no logit scale. Both share one
relative-position bias per stack (stored in the reference's first layer only), RMSNorm without
bias, pre-norm with a final norm and unscaled attention.
"""
from __future__ import annotations

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert.family import (Family, activation_of, ffn_of, flag, special_tokens, special_tokens_of,
                                    tied_with_stack_tables)
from lmforge.convert.keymap import Rule, expand
from lmforge.presets import T5

# gated activations by the reference's dense_act_fn (exact "gelu" is GEGLU; "gelu_new" the tanh one)
GATED = {"gelu": "geglu", "gelu_python": "geglu", "gelu_new": "geglu-tanh", "gelu_pytorch_tanh": "geglu-tanh",
         "gelu_fast": "geglu-tanh", "silu": "swiglu", "swish": "swiglu"}
GATED_NAMES = {"geglu-tanh": "gated-gelu", "swiglu": "gated-silu"}
# what dense_act_fn to write where feed_forward_proj alone does not say it (gated-gelu means gelu_new)
ACT_NAMES = {"geglu": "gelu", "geglu-tanh": "gelu_new", "swiglu": "silu"}


def ffn_of_projection(hf: dict) -> str:
    """lmforge ffn of a T5 config. The reference applies its stored `dense_act_fn` and `is_gated_act`,
    which win over `feed_forward_proj` ("relu", "gated-gelu", ...) that they are otherwise derived from:
    stored ones that disagree with it are refused, naming both (hand-edited configs; versions differ)."""
    name = hf.get("feed_forward_proj", "relu")
    parts = name.split("-") if isinstance(name, str) else []
    if not 1 <= len(parts) <= 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise ConfigError(f"feed_forward_proj={name!r} is not of the form 'ACT' or 'gated-ACT'",
                          "feed_forward_proj")
    gated = len(parts) == 2
    derived = "gelu_new" if name == "gated-gelu" else parts[-1]  # the reference's compatibility rule
    act = hf.get("dense_act_fn") or derived
    if hf.get("is_gated_act", gated) != gated or act not in (derived, parts[-1]):
        raise ConfigError(f"feed_forward_proj={name!r} disagrees with dense_act_fn={act!r}, is_gated_act="
                          f"{hf.get('is_gated_act', gated)}: mend config.json so that they agree",
                          "feed_forward_proj")
    if not gated:
        return ffn_of(act, "feed_forward_proj")
    if act not in GATED:
        raise ConfigError(f"feed_forward_proj={name!r} is not supported; gated activations: "
                          f"{', '.join(GATED)}", "feed_forward_proj")
    return GATED[act]


def projection_of(ffn: str) -> dict:
    """The inverse of `ffn_of_projection`: feed_forward_proj, dense_act_fn and is_gated_act."""
    if ffn in ACT_NAMES:
        return dict(feed_forward_proj=GATED_NAMES.get(ffn, "gated-gelu"), dense_act_fn=ACT_NAMES[ffn],
                    is_gated_act=True)
    return dict(feed_forward_proj=activation_of(ffn), dense_act_fn=activation_of(ffn), is_gated_act=False)


def _encoder_only(hf: dict) -> bool:
    architecture = (hf.get("architectures") or [None])[0]
    if architecture is not None:
        return architecture == "T5EncoderModel"
    return not flag(hf, "is_encoder_decoder", True)


def config(hf: dict) -> ModelConfig:
    """T5Config fields -> ModelConfig."""
    # the reference keeps tying and scaling apart since v5 (scale_decoder_outputs); older
    # configs say both with tie_word_embeddings
    tied = flag(hf, "tie_word_embeddings", True)
    encoder_only = _encoder_only(hf)
    n_decoder = hf.get("num_decoder_layers")
    return ModelConfig.from_dict(dict(
        T5, architecture="encoder" if encoder_only else "encoder-decoder",
        vocab_size=hf["vocab_size"], d_model=hf["d_model"], d_head=hf["d_kv"], d_ff=hf["d_ff"],
        n_layers=hf["num_layers"], n_heads=hf["num_heads"],
        n_decoder_layers=None if encoder_only or n_decoder == hf["num_layers"] else n_decoder,
        max_seq_len=hf.get("n_positions", 512),
        relative_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_max_distance=hf.get("relative_attention_max_distance", 128),
        dropout=hf.get("dropout_rate", 0.1), attention_dropout=hf.get("dropout_rate", 0.1),
        norm_eps=hf.get("layer_norm_epsilon", 1e-6),
        ffn=ffn_of_projection(hf),
        tie_embeddings=tied, tied_logit_scale=hf.get("scale_decoder_outputs", tied), **special_tokens(hf)))


def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> T5Config fields."""
    if cfg.dropout != cfg.attention_dropout:
        raise ConfigError("T5 has one dropout_rate; dropout and attention_dropout differ",
                          "attention_dropout")
    return dict(vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_kv=cfg.head_dim, d_ff=cfg.d_ff,
                num_layers=cfg.n_layers, num_decoder_layers=cfg.decoder_layers, num_heads=cfg.n_heads,
                n_positions=cfg.max_seq_len, relative_attention_num_buckets=cfg.relative_buckets,
                relative_attention_max_distance=cfg.relative_max_distance, dropout_rate=cfg.dropout,
                layer_norm_epsilon=cfg.norm_eps, **projection_of(cfg.ffn),
                tie_word_embeddings=cfg.tie_embeddings, scale_decoder_outputs=cfg.tied_logit_scale,
                is_encoder_decoder=cfg.architecture == "encoder-decoder", **special_tokens_of(cfg))


def _stack(cfg: ModelConfig, side: str, n_layers: int, cross: bool) -> list:
    """Rules of one stack: the shared relative bias, its blocks, its final norm."""
    block, layer = f"{side}.blocks.{{i}}", f"{side}.block.{{i}}.layer"
    attn = f"{layer}.0.SelfAttention"
    ffn_index = 2 if cross else 1
    dense = f"{layer}.{ffn_index}.DenseReluDense"
    gated = cfg.ffn in ACT_NAMES
    rules = [
        Rule(f"{block}.attn.qkv.weight", tuple(f"{attn}.{p}.weight" for p in "qkv")),
        Rule(f"{block}.attn.out.weight", (f"{attn}.o.weight",)),
        Rule(f"{block}.attn_norm.weight", (f"{layer}.0.layer_norm.weight",)),
        Rule(f"{block}.ffn.up.weight", (f"{dense}.wi_1.weight" if gated else f"{dense}.wi.weight",)),
        Rule(f"{block}.ffn.down.weight", (f"{dense}.wo.weight",)),
        Rule(f"{block}.ffn_norm.weight", (f"{layer}.{ffn_index}.layer_norm.weight",)),
    ]
    if gated:  # the activation acts on wi_0: act(wi_0 x) * wi_1 x
        rules.append(Rule(f"{block}.ffn.gate.weight", (f"{dense}.wi_0.weight",)))
    if cross:
        cross_attn = f"{layer}.1.EncDecAttention"
        rules += [Rule(f"{block}.cross_attn.q.weight", (f"{cross_attn}.q.weight",)),
                  Rule(f"{block}.cross_attn.kv.weight",
                       (f"{cross_attn}.k.weight", f"{cross_attn}.v.weight")),
                  Rule(f"{block}.cross_attn.out.weight", (f"{cross_attn}.o.weight",)),
                  Rule(f"{block}.cross_norm.weight", (f"{layer}.1.layer_norm.weight",))]
    # the reference computes the bias in layer 0 and passes it on; lmforge's stack owns it
    bias = f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    return expand(rules, n_layers) + [
        Rule(f"{side}.bias.weight", (bias,)),
        Rule(f"{side}.final_norm.weight", (f"{side}.final_layer_norm.weight",))]


def backbone(cfg: ModelConfig) -> list:
    """The shared token table and the stacks (already written out per layer: depths differ)."""
    rules = [Rule("tokens.weight", ("shared.weight",)), *_stack(cfg, "encoder", cfg.n_layers, cross=False)]
    if cfg.architecture == "encoder-decoder":
        rules += _stack(cfg, "decoder", cfg.decoder_layers, cross=True)
    return rules


def head_rules(name: str, kind: str, cfg: ModelConfig) -> list:
    """T5's LM head is the token table (tied, v1.0) or `lm_head` (v1.1)."""
    if kind == "lm":
        return [] if cfg.tie_embeddings else [Rule(f"heads.{name}.decoder.weight", ("lm_head.weight",))]
    raise ConfigError(f"head kind {kind!r} has no T5 checkpoint layout", "kind")


FAMILY = Family(
    model_types=("t5",),
    prefix="",
    config=config,
    backbone=backbone,
    heads={
        "T5Model": lambda hf: [],
        "T5ForConditionalGeneration": lambda hf: [("lm", "lm", {})],
        "T5EncoderModel": lambda hf: [],
    },
    head_rules=head_rules,
    to_reference=to_reference,
    bare=("T5Model", "T5ForConditionalGeneration", "T5EncoderModel"),
    head_keys=r"lm_head\..*",
    # per-stack copies of the token table (older checkpoints), the tied LM head, and the
    # never-used relative bias old checkpoints kept in the first cross-attention
    ignore=(r"(encoder|decoder)\.embed_tokens\.weight", r"lm_head\.weight",
            r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight"),
    refine=tied_with_stack_tables,
)
