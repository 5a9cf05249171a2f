"""GPT (Radford et al. 2018) in the reference library's layout: model_type "openai-gpt".

Post-norm blocks (x = LN(x + Sublayer(x))), learned positions, no embedding norm and no
final norm; Conv1D weights stored as (in, out) as in GPT-2; the feed-forward width is
fixed at 4 d_model. The reference's "gelu" is the tanh approximation, as in the paper's code.
"""
from __future__ import annotations

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert.family import Family, n_labels, special_tokens, special_tokens_of, tied_by_weights
from lmforge.convert.keymap import Rule, linear
from lmforge.presets import GPT

AFN = {"gelu": "gelu-tanh", "relu": "relu"}  # reference `afn` -> lmforge ffn
AFN_NAMES = {v: k for k, v in AFN.items()}


def config(hf: dict) -> ModelConfig:
    """OpenAIGPTConfig fields -> ModelConfig."""
    afn = hf.get("afn", "gelu")
    if afn not in AFN:
        raise ConfigError(f"afn={afn!r} is not supported; known: {', '.join(AFN)}", "afn")
    d_model = hf["n_embd"]
    return ModelConfig.from_dict(dict(
        GPT, vocab_size=hf["vocab_size"], d_model=d_model, n_layers=hf["n_layer"], n_heads=hf["n_head"],
        d_ff=4 * d_model, max_seq_len=hf["n_positions"], norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        ffn=AFN[afn], dropout=hf.get("resid_pdrop", 0.1), attention_dropout=hf.get("attn_pdrop", 0.1),
        tie_embeddings=hf.get("tie_word_embeddings", True), **special_tokens(hf)))


def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> OpenAIGPTConfig fields (`family_of` checks that they express `cfg` exactly)."""
    if cfg.ffn not in AFN_NAMES:
        raise ConfigError(f"ffn={cfg.ffn!r} has no openai-gpt activation; known: {', '.join(AFN_NAMES)}",
                          "ffn")
    return dict(vocab_size=cfg.vocab_size, n_embd=cfg.d_model, n_layer=cfg.n_layers, n_head=cfg.n_heads,
                n_positions=cfg.max_seq_len, layer_norm_epsilon=cfg.norm_eps, afn=AFN_NAMES[cfg.ffn],
                resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.attention_dropout,
                tie_word_embeddings=cfg.tie_embeddings, **special_tokens_of(cfg))


def backbone(cfg: ModelConfig) -> list:
    """Embeddings and post-norm blocks (Conv1D weights are transposed); no final norm."""
    layer, block = "h.{i}", "decoder.blocks.{i}"
    return [
        Rule("tokens.weight", ("tokens_embed.weight",)),
        Rule("embed.positions.weight", ("positions_embed.weight",)),
        *linear(f"{block}.attn.qkv", f"{layer}.attn.c_attn", "transpose"),
        *linear(f"{block}.attn.out", f"{layer}.attn.c_proj", "transpose"),
        *linear(f"{block}.attn_norm", f"{layer}.ln_1"),
        *linear(f"{block}.ffn.up", f"{layer}.mlp.c_fc", "transpose"),
        *linear(f"{block}.ffn.down", f"{layer}.mlp.c_proj", "transpose"),
        *linear(f"{block}.ffn_norm", f"{layer}.ln_2"),
    ]


def head_rules(name: str, kind: str, cfg: ModelConfig) -> list:
    """The LM head is the tied token table (or `lm_head`); sequence scores are `score`."""
    if kind == "lm":
        return [] if cfg.tie_embeddings else [Rule(f"heads.{name}.decoder.weight", ("lm_head.weight",))]
    if kind == "classification":
        return [Rule(f"heads.{name}.classifier.weight", ("score.weight",))]
    raise ConfigError(f"head kind {kind!r} has no openai-gpt checkpoint layout", "kind")


FAMILY = Family(
    model_types=("openai-gpt",),
    prefix="transformer.",
    config=config,
    backbone=backbone,
    heads={
        "OpenAIGPTModel": lambda hf: [],
        "OpenAIGPTLMHeadModel": lambda hf: [("lm", "lm", {})],
        # the score of the last real token, without a bias
        "OpenAIGPTForSequenceClassification": lambda hf: [
            ("classification", "classification",
             {"n_labels": n_labels(hf), "pooling": "last", "pooler": False, "bias": False})],
    },
    head_rules=head_rules,
    to_reference=to_reference,
    bare=("OpenAIGPTModel",),
    head_keys=r"(lm_head|score)\..*",
    # causal-mask and position-id buffers of old checkpoints; the tied copy of the token table
    ignore=(r"h\.\d+\.attn\.bias", r"position_ids", r"lm_head\.weight"),
    refine=tied_by_weights("tokens_embed.weight", "lm_head.weight"),
)
