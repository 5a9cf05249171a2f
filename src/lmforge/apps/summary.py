"""What `lmforge inspect` prints: architecture, parameter counts and FLOPs per token.

Counting never builds a block per layer: a config's parameters are counted on the meta device
for a sample of at most one layer per distinct pattern (plus one), and what one more layer adds
is multiplied out, so `n_layers=100000000` answers in a second with flat memory.
"""
from __future__ import annotations

from collections import Counter

import torch

from lmforge.config import ModelConfig
from lmforge.model import from_config

GATED = ("geglu", "geglu-tanh", "swiglu")


def pattern_counts(cfg: ModelConfig) -> dict:
    """pattern -> number of layers using it (without a list per layer: n_layers may be huge)."""
    if cfg.attention_schedule:
        return dict(Counter(cfg.attention_schedule))
    return {cfg.attention: cfg.n_layers}


def _attended_keys(cfg: ModelConfig, pattern: str, context: int) -> int:
    """Keys each query attends to under `pattern` at sequence length `context`."""
    if pattern in ("sliding-window", "dilated"):
        return min(context, cfg.window + 1)
    if pattern == "longformer":
        return min(context, cfg.window + 1 + cfg.n_global_tokens)
    if pattern == "bigbird":
        return min(context, (3 + 2 + cfg.n_random_blocks) * cfg.block_size)
    if pattern == "linformer":
        return min(context, cfg.linformer_k)
    return context


def flops_per_token(cfg: ModelConfig, context: int | None = None, lm_head: bool = True) -> int:
    """Forward FLOPs per token (2 per multiply-add): Kaplan et al. 2020, Table 1, with the
    attention-weighted sum of values counted as well as the logits (as in PaLM, App. B).

    Counts every matrix multiply a token goes through: projections and feed-forward of each
    layer (shared ALBERT layers counted at every use), attention scores and mixing over the
    keys the pattern lets it see, the embedding projection and the vocabulary projection.
    An encoder-decoder counts one encoder and one decoder token (cross-attention included)."""
    context = cfg.max_seq_len if context is None else context
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"context must be a positive number of tokens, got {context!r}")
    d, dh = cfg.d_model, cfg.head_dim
    q_dim, kv_dim = cfg.n_heads * dh, cfg.kv_heads * dh
    projections = d * q_dim + 2 * d * kv_dim + q_dim * d
    ffn = d * cfg.d_ff * (3 if cfg.ffn in GATED else 2)
    macs = sum(n * (projections + ffn + 2 * _attended_keys(cfg, p, context) * q_dim)
               for p, n in pattern_counts(cfg).items())
    if cfg.architecture == "encoder-decoder":
        self_attn = projections + 2 * _attended_keys(cfg, "full", context) * q_dim
        macs += cfg.decoder_layers * (self_attn + ffn + projections + 2 * context * q_dim)
    macs -= _pruned_macs(cfg, context)
    if cfg.embed_dim != d:
        macs += cfg.embed_dim * d
    if lm_head:
        macs += (d * cfg.embed_dim if cfg.lm_transform else 0) + cfg.embed_dim * cfg.vocab_size
    return 2 * macs


def _pruned_macs(cfg: ModelConfig, context: int) -> int:
    """Multiply-adds per token that pruned heads (cfg.pruned_heads) and FFN units (cfg.ffn_sizes) no
    longer cost: a head's q, k, v and output columns and its scores and mixing; a unit's W1 (V) and
    W2 weights."""
    d, dh = cfg.d_model, cfg.head_dim
    macs = sum((cfg.d_ff - n) * d * (3 if cfg.ffn in GATED else 2) for n in (cfg.ffn_sizes or {}).values())
    patterns = cfg.layer_patterns() if cfg.pruned_heads else []  # a list per layer: only when needed
    for key, heads in (cfg.pruned_heads or {}).items():
        attention, _, layer = key.partition(".")
        seq2seq_decoder = attention != "encoder" and cfg.architecture == "encoder-decoder"
        keys = context if attention == "cross" else _attended_keys(
            cfg, "full" if seq2seq_decoder else patterns[int(layer)], context)
        macs += len(heads) * (4 * d * dh + 2 * keys * dh)
    return macs


def _meta_counts(cfg: ModelConfig) -> tuple:
    """(all, non-embedding) backbone parameters of `cfg` built on the meta device (shapes only)."""
    try:
        with torch.device("meta"):
            model = from_config(cfg, init=False)
    except (RuntimeError, OverflowError, MemoryError) as err:  # a tensor past int64 elements
        raise ValueError(f"too large to count (a weight matrix must hold < 2**63 elements): {err}") from None
    return model.num_parameters(), model.num_parameters(embeddings=False)


def _sample(cfg: ModelConfig, patterns: list, decoder_layers: int) -> ModelConfig:
    """`cfg` with one layer per entry of `patterns` (and `decoder_layers` decoder layers)."""
    changes = {"n_layers": len(patterns), "window_schedule": None,
               "attention_schedule": patterns if cfg.attention_schedule else None}
    if cfg.window_schedule:  # windows change masks, never shapes
        changes["window"] = max(cfg.window_schedule)
    if cfg.architecture == "encoder-decoder":
        changes["n_decoder_layers"] = decoder_layers
    return cfg.replace(**changes)


def config_parameter_counts(cfg: ModelConfig) -> dict:
    """parameter_counts of the model `cfg` describes, at any depth: a sample with one layer per
    pattern, plus (layers - 1) x what one more layer of each pattern (and of the decoder) adds."""
    layers = pattern_counts(cfg)
    distinct = list(layers)
    total, body = _meta_counts(_sample(cfg, distinct, 1))
    grown = [(layers[p] - 1, _sample(cfg, distinct + [p], 1)) for p in distinct]
    if cfg.architecture == "encoder-decoder":
        grown.append((cfg.decoder_layers - 1, _sample(cfg, distinct, 2)))
    extra_total = extra_body = 0
    for times, sample in grown:
        more_total, more_body = _meta_counts(sample)
        extra_total += times * (more_total - total)
        extra_body += times * (more_body - body)
    total, body = total + extra_total, body + extra_body
    return {"total": total, "embeddings": total - body, "non_embedding": body}


def parameter_counts(model) -> dict:
    """Backbone parameters: total, in the token/position tables, and the rest; of a model, or of a
    config (counted without building it: config_parameter_counts)."""
    if isinstance(model, ModelConfig):
        return config_parameter_counts(model)
    total = model.num_parameters()
    body = model.num_parameters(embeddings=False)
    return {"total": total, "embeddings": total - body, "non_embedding": body}


def _millions(n: int) -> str:
    return f"{n / 1e6:,.2f}M" if n >= 1e5 else f"{n:,}"


def describe(model, context: int | None = None) -> str:
    """A human-readable summary of the architecture and cost of a model or a config (any size)."""
    cfg = model if isinstance(model, ModelConfig) else model.config
    context = cfg.max_seq_len if context is None else context
    counts = parameter_counts(model)
    flops = flops_per_token(cfg, context)
    kv = cfg.kv_heads
    shared = "" if kv == cfg.n_heads else f", {kv} kv head{'s' * (kv > 1)} ({'MQA' if kv == 1 else 'GQA'})"
    heads = f"{cfg.n_heads} heads x {cfg.head_dim}{shared}"
    decoder = f" + {cfg.decoder_layers} decoder" if cfg.architecture == "encoder-decoder" else ""
    depth = f"{cfg.n_layers}{decoder}"
    patterns = sorted(pattern_counts(cfg))
    lines = [
        f"architecture   {cfg.architecture}",
        f"layers         {depth}{' (one shared block)' if cfg.share_layers else ''}",
        f"width          d_model={cfg.d_model}, d_ff={cfg.d_ff}, {heads}",
        f"embeddings     vocab={cfg.vocab_size}, E={cfg.embed_dim}, segments={cfg.n_segments}, "
        f"tied={cfg.tie_embeddings}, norm={cfg.embedding_norm}",
        f"positions      {cfg.position}, max_seq_len={cfg.max_seq_len}",
        f"norm           {cfg.norm} ({cfg.norm_placement}-norm, final={cfg.has_final_norm})",
        f"feed-forward   {cfg.ffn}",
        f"attention      {', '.join(patterns)}",
        f"parameters     {_millions(counts['total'])} total, {_millions(counts['embeddings'])} embeddings, "
        f"{_millions(counts['non_embedding'])} non-embedding",
        f"FLOPs/token    {flops / 1e9:,.3f} GFLOP forward, {3 * flops / 1e9:,.3f} GFLOP training "
        f"(context {context})",
    ]
    if cfg.source:
        lines.append(f"source         {cfg.source}")
    return "\n".join(lines)
