"""What a model described by a config needs in memory, checked before a single tensor is allocated.

The count follows the layers' shapes (embeddings, attention, feed-forward, norms, cross-attention) to
within a few percent; it is a guard against configs that cannot fit (a `config.json` with n_layers in
the millions), not an accountant: the exact count is `model.num_parameters()` once built.
"""
from __future__ import annotations

import os

from lmforge.config.checks import ConfigError

GATED = ("geglu", "geglu-tanh", "swiglu")


def _layer(cfg, cross: bool) -> int:
    """Weights of one block: q, k, v, o (and cross-attention's), the FFN, biases and norms."""
    d, inner, kv = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    attention = d * inner * 2 + d * kv * 2 + 2 * inner + 2 * kv
    ffn = d * cfg.d_ff * (3 if cfg.ffn in GATED else 2) + cfg.d_ff + d
    return attention * (2 if cross else 1) + ffn + 6 * d


def _encoder_extras(cfg) -> int:
    """What some encoders' blocks hold beyond _layer's, all layers together: Longformer's global q, k, v;
    XLNet's position projection W_r, its biases u, v, s and segment embeddings; Linformer's E and F."""
    d, inner = cfg.d_model, cfg.n_heads * cfg.head_dim
    patterns = cfg.layer_patterns()[:1] if cfg.share_layers else cfg.layer_patterns()
    extra = 0
    if cfg.global_projections:
        extra += patterns.count("longformer") * 3 * (d * inner + inner)
    extra += patterns.count("linformer") * 2 * cfg.linformer_k * cfg.max_seq_len
    if cfg.position == "xl-relative":
        extra += len(patterns) * (d * inner + 5 * inner)
    return extra


def _elmo(cfg) -> dict:
    """ELMo: the character CNN, highways and projection, two LSTMP stacks, the softmax over the words."""
    filters = sum(n for _, n in cfg.cnn_filters)
    convolutions = sum(width * n * cfg.char_embed_dim + n for width, n in cfg.cnn_filters)
    cnn = cfg.n_characters * cfg.char_embed_dim + convolutions
    highway = cfg.n_highway * 2 * (filters * filters + filters)  # carry and transform: f x f each
    cell, d = cfg.lstm_dim, cfg.d_model
    lstm = 2 * cfg.n_layers * (4 * cell * 2 * d + 4 * cell + cell * d)  # input, state (+ bias), projection
    return {"vocab_size": cfg.vocab_size * (d + 1),
            "n_layers": lstm + cnn + highway + filters * d + d}


def parameter_shares(cfg) -> dict:
    """Parameters by the field that sizes them: vocab_size (token table, LM head), max_seq_len (learned
    positions), n_layers (the blocks; an encoder-decoder's decoder under n_decoder_layers)."""
    if cfg.architecture == "elmo":
        return _elmo(cfg)
    E, d = cfg.embed_dim, cfg.d_model
    shares = {"vocab_size": cfg.vocab_size * E * (1 if cfg.tie_embeddings else 2) + (E * d if E != d else 0),
              "max_seq_len": (cfg.max_seq_len + cfg.position_offset) * E if cfg.position == "learned" else 0,
              "n_layers": (1 if cfg.share_layers else cfg.n_layers) * _layer(cfg, cross=False)
              + _encoder_extras(cfg)}
    if cfg.architecture == "encoder-decoder":
        shares["n_decoder_layers"] = cfg.decoder_layers * _layer(cfg, cross=True)
    return shares


def meminfo(field: str) -> int | None:
    """Bytes of one of the kernel's /proc/meminfo fields (MemTotal, MemAvailable ...), or None where it
    cannot be read (not Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def available_bytes() -> int | None:
    """This machine's memory (MemTotal: what other processes hold now comes and goes, and a model that
    fits once they finish should build), or None where it cannot be read."""
    return meminfo("MemTotal")


def check_fits(cfg, bytes_per_parameter: int = 4, available: int | None = None) -> None:
    """Refuse a config whose fp32 parameters alone need more memory than the machine has, naming the field
    that sizes the largest share and the bytes it needs (ConfigError)."""
    env = os.environ.get("LMFORGE_MEMORY_LIMIT")  # for tests, and for machines shared with other work
    free = int(float(env)) if env else (available if available is not None else available_bytes())
    shares = parameter_shares(cfg)
    need = sum(shares.values()) * bytes_per_parameter
    if free is None or need <= free:
        return
    field = max(shares, key=shares.get)
    raise ConfigError(f"{field}={getattr(cfg, field if field != 'n_decoder_layers' else 'decoder_layers')}: "
                      f"the model's parameters need {need / 2**30:.1f} GiB, more than the "
                      f"{free / 2**30:.1f} GiB of memory this machine has", field)
