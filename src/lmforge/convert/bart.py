"""BART (Lewis et al. 2020) in the reference library's layout: model_type "bart".

Post-norm encoder-decoder with learned positions starting at offset 2, a LayerNorm after
each stack's embeddings, optional sqrt(d_model) embedding scale, one token table shared by
both stacks and the LM head, and the LM head's bias kept as the `final_logits_bias` buffer.
"""
from __future__ import annotations

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert.family import (STACK_TABLES, Family, activation_of, ffn_of, flag, n_labels,
                                    special_tokens, special_tokens_of, tied_with_stack_tables)
from lmforge.convert.keymap import Rule, expand, linear
from lmforge.presets import BART

# options of older BartConfigs (mBART / Marian / Pegasus variants) and their BART values
FIXED = {"normalize_before": False, "add_final_layer_norm": False, "static_position_embeddings": False,
         "normalize_embedding": True, "add_bias_logits": False}


def _check(hf: dict) -> None:
    for option, value in FIXED.items():
        if hf.get(option, value) != value:
            raise ConfigError(f"BART option {option}={hf[option]!r} is not supported", option)
    # lmforge has one n_heads and one d_ff for both stacks
    for enc, dec in (("encoder_attention_heads", "decoder_attention_heads"),
                     ("encoder_ffn_dim", "decoder_ffn_dim")):
        if hf.get(dec, hf[enc]) != hf[enc]:
            raise ConfigError(f"BART option {dec}={hf[dec]} differs from {enc}={hf[enc]}, which lmforge "
                              f"cannot express", dec)


def config(hf: dict) -> ModelConfig:
    """BartConfig fields -> ModelConfig (dropout inside the FFN and LayerDrop only act in training
    and are not kept)."""
    _check(hf)
    n_layers = hf["encoder_layers"]
    n_decoder = hf.get("decoder_layers", n_layers)
    return ModelConfig.from_dict(dict(
        BART, vocab_size=hf["vocab_size"], d_model=hf["d_model"], n_layers=n_layers,
        n_decoder_layers=None if n_decoder == n_layers else n_decoder, n_heads=hf["encoder_attention_heads"],
        d_ff=hf["encoder_ffn_dim"], max_seq_len=hf["max_position_embeddings"],
        ffn=ffn_of(hf.get("activation_function", "gelu"), "activation_function"),
        dropout=hf.get("dropout", 0.1),
        attention_dropout=hf.get("attention_dropout", 0.0), scale_embeddings=hf.get("scale_embedding", False),
        tie_embeddings=flag(hf, "tie_word_embeddings", True), **special_tokens(hf)))


def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> BartConfig fields; an unset forced eos is written as null, which older
    versions of the reference would read as BartConfig's default, 2."""
    return dict(vocab_size=cfg.vocab_size, d_model=cfg.d_model, encoder_layers=cfg.n_layers,
                decoder_layers=cfg.decoder_layers, encoder_attention_heads=cfg.n_heads,
                decoder_attention_heads=cfg.n_heads, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
                max_position_embeddings=cfg.max_seq_len, activation_function=activation_of(cfg.ffn),
                dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
                scale_embedding=cfg.scale_embeddings, tie_word_embeddings=cfg.tie_embeddings,
                **{"forced_eos_token_id": None, **special_tokens_of(cfg)})


def _attention(ours: str, theirs: str, cross: bool) -> list:
    proj = [f"{theirs}.{p}_proj" for p in ("q", "k", "v")]
    fused = [(f"{ours}.q", proj[:1]), (f"{ours}.kv", proj[1:])] if cross else [(f"{ours}.qkv", proj)]
    rules = [Rule(f"{name}.{p}", tuple(f"{t}.{p}" for t in parts)) for name, parts in fused
             for p in ("weight", "bias")]
    return rules + linear(f"{ours}.out", f"{theirs}.out_proj")


def _stack(side: str, n_layers: int, cross: bool) -> list:
    """Rules of one stack: its embedding positions and norm, then its post-norm blocks."""
    block, layer = f"{side}.blocks.{{i}}", f"{side}.layers.{{i}}"
    rules = [*_attention(f"{block}.attn", f"{layer}.self_attn", cross=False),
             *linear(f"{block}.attn_norm", f"{layer}.self_attn_layer_norm"),
             *linear(f"{block}.ffn.up", f"{layer}.fc1"),
             *linear(f"{block}.ffn.down", f"{layer}.fc2"),
             *linear(f"{block}.ffn_norm", f"{layer}.final_layer_norm")]
    if cross:
        rules += [*_attention(f"{block}.cross_attn", f"{layer}.encoder_attn", cross=True),
                  *linear(f"{block}.cross_norm", f"{layer}.encoder_attn_layer_norm")]
    return [Rule(f"{side}_embed.positions.weight", (f"{side}.embed_positions.weight",)),
            *linear(f"{side}_embed.norm", f"{side}.layernorm_embedding"), *expand(rules, n_layers)]


def backbone(cfg: ModelConfig) -> list:
    """The shared token table and both stacks (written out per layer: the depths may differ)."""
    return [Rule("tokens.weight", ("shared.weight",)), *_stack("encoder", cfg.n_layers, cross=False),
            *_stack("decoder", cfg.decoder_layers, cross=True)]


def fixed(cfg: ModelConfig, tensors: dict) -> dict:
    """Untied, the reference reads each stack's token table from its own name: write `shared` there."""
    return {} if cfg.tie_embeddings else {name: tensors["shared.weight"].clone() for name in STACK_TABLES}


def head_rules(name: str, kind: str, cfg: ModelConfig) -> list:
    """Where each head's tensors live in a BART checkpoint."""
    h = f"heads.{name}"
    if kind == "lm":
        rules = [Rule(f"{h}.bias", ("final_logits_bias",), "row")]
        if not cfg.tie_embeddings:
            rules.append(Rule(f"{h}.decoder.weight", ("lm_head.weight",)))
        return rules
    if kind == "classification":
        return [*linear(f"{h}.pooler.dense", "classification_head.dense"),
                *linear(f"{h}.classifier", "classification_head.out_proj")]
    if kind == "span-qa":
        return linear(f"{h}.qa", "qa_outputs")
    raise ConfigError(f"head kind {kind!r} has no BART checkpoint layout", "kind")


FAMILY = Family(
    model_types=("bart",),
    prefix="model.",
    config=config,
    backbone=backbone,
    heads={
        "BartModel": lambda hf: [],
        "BartForConditionalGeneration": lambda hf: [("lm", "lm", {})],
        # the reference pools the decoder state at each row's last eos; with the decoder mask
        # given and every row ending in its eos, that is the last real position
        "BartForSequenceClassification": lambda hf: [("classification", "classification",
                                                      {"n_labels": n_labels(hf), "pooling": "last"})],
        "BartForQuestionAnswering": lambda hf: [("span-qa", "span-qa", {})],
    },
    head_rules=head_rules,
    to_reference=to_reference,
    bare=("BartModel",),
    head_keys=r"final_logits_bias|(lm_head|classification_head|qa_outputs)\..*",
    # per-stack copies of the token table and version markers (older checkpoints); the tied LM head
    ignore=(r"(encoder|decoder)\.embed_tokens\.weight", r"(encoder|decoder)\.version", r"lm_head\.weight"),
    refine=tied_with_stack_tables,
    fixed=fixed,
)
