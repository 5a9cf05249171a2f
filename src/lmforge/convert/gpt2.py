"""GPT-2 (Radford et al. 2019) in the reference library's layout: model_type "gpt2"."""
from __future__ import annotations

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert.family import (Family, activation_of, decoder_head_rules, decoder_task_heads, ffn_of,
                                    flag, special_tokens, special_tokens_of, tied_by_weights)
from lmforge.convert.keymap import Rule, linear
from lmforge.presets import GPT2


def config(hf: dict) -> ModelConfig:
    """GPT2Config fields -> ModelConfig."""
    for option in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if hf.get(option):
            raise ConfigError(f"GPT-2 option {option}=true is not supported", option)
    if not flag(hf, "scale_attn_weights", True):  # unscaled scores; lmforge divides by sqrt(d_head)
        raise ConfigError("GPT-2 option scale_attn_weights=false is not supported", "scale_attn_weights")
    d_model = hf["n_embd"]
    return ModelConfig.from_dict(dict(
        GPT2, vocab_size=hf["vocab_size"], d_model=d_model, n_layers=hf["n_layer"], n_heads=hf["n_head"],
        d_ff=hf.get("n_inner") or 4 * d_model, max_seq_len=hf["n_positions"],
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), ffn=ffn_of(hf.get("activation_function", "gelu_new"),
                                                                     "activation_function"),
        dropout=hf.get("resid_pdrop", 0.1), attention_dropout=hf.get("attn_pdrop", 0.1),
        tie_embeddings=hf.get("tie_word_embeddings", True), **special_tokens(hf)))



def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> GPT2Config fields."""
    return dict(vocab_size=cfg.vocab_size, n_embd=cfg.d_model, n_layer=cfg.n_layers, n_head=cfg.n_heads,
                n_inner=cfg.d_ff, n_positions=cfg.max_seq_len, layer_norm_epsilon=cfg.norm_eps,
                activation_function=activation_of(cfg.ffn), resid_pdrop=cfg.dropout,
                embd_pdrop=cfg.dropout, attn_pdrop=cfg.attention_dropout,
                tie_word_embeddings=cfg.tie_embeddings, **special_tokens_of(cfg))


def backbone(cfg: ModelConfig) -> list:
    """Embeddings, blocks (Conv1D weights are transposed) and the final norm."""
    layer, block = "h.{i}", "decoder.blocks.{i}"
    return [
        Rule("tokens.weight", ("wte.weight",)),
        Rule("embed.positions.weight", ("wpe.weight",)),
        *linear(f"{block}.attn_norm", f"{layer}.ln_1"),
        *linear(f"{block}.attn.qkv", f"{layer}.attn.c_attn", "transpose"),
        *linear(f"{block}.attn.out", f"{layer}.attn.c_proj", "transpose"),
        *linear(f"{block}.ffn_norm", f"{layer}.ln_2"),
        *linear(f"{block}.ffn.up", f"{layer}.mlp.c_fc", "transpose"),
        *linear(f"{block}.ffn.down", f"{layer}.mlp.c_proj", "transpose"),
        *linear("decoder.final_norm", "ln_f"),
    ]


FAMILY = Family(
    model_types=("gpt2",),
    prefix="transformer.",
    config=config,
    backbone=backbone,
    heads={
        "GPT2Model": lambda hf: [],
        "GPT2LMHeadModel": lambda hf: [("lm", "lm", {})],
        **decoder_task_heads("GPT2"),
    },
    head_rules=decoder_head_rules("GPT-2"),
    to_reference=to_reference,
    bare=("GPT2Model",),
    head_keys=r"(lm_head|score|classifier|qa_outputs)\..*",
    # causal-mask buffers of old checkpoints; the tied copy of the token table
    ignore=(r"h\.\d+\.attn\.(masked_)?bias", r"lm_head\.weight"),
    refine=tied_by_weights("wte.weight", "lm_head.weight"),
)
