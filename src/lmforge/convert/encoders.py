"""Config fields and checks shared by the BERT-descended encoder families (RoBERTa, ALBERT, ELECTRA).

Their reference configs spell the sizes as BERT does; each family adds its own fields
(RoBERTa's position offset, ALBERT's groups, the embedding size E) on top of these.
"""
from __future__ import annotations

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert.family import activation_of, ffn_of, special_tokens, special_tokens_of


def check_encoder(hf: dict) -> None:
    """Refuse the options of these configs that lmforge's encoders do not have, by name."""
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(f"position_embedding_type={hf['position_embedding_type']!r} is not supported",
                          "position_embedding_type")
    for flag in ("is_decoder", "add_cross_attention"):
        if hf.get(flag):
            raise ConfigError(f"{flag}=true is not supported (lmforge loads these families as encoders)",
                              flag)


def encoder_fields(hf: dict, act: str = "gelu", dropout: float = 0.1) -> dict:
    """BERT-style size, norm, dropout, tying and special-token fields -> ModelConfig fields;
    `act` and `dropout` are the family's defaults for an absent hidden_act / dropout."""
    check_encoder(hf)
    return dict(vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
                n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
                n_segments=hf.get("type_vocab_size", 2), norm_eps=hf.get("layer_norm_eps", 1e-12),
                ffn=ffn_of(hf.get("hidden_act", act)), dropout=hf.get("hidden_dropout_prob", dropout),
                attention_dropout=hf.get("attention_probs_dropout_prob", dropout),
                tie_embeddings=hf.get("tie_word_embeddings", True), **special_tokens(hf))


def reference_fields(cfg: ModelConfig) -> dict:
    """The inverse of `encoder_fields`."""
    if cfg.n_segments < 1:  # these references always add token-type embeddings
        raise ConfigError("this family needs n_segments >= 1 (token-type embeddings)", "n_segments")
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_ff, type_vocab_size=cfg.n_segments,
                layer_norm_eps=cfg.norm_eps, hidden_act=activation_of(cfg.ffn),
                hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attention_dropout,
                tie_word_embeddings=cfg.tie_embeddings, **special_tokens_of(cfg))
