"""What `lmforge inspect` prints: architecture, parameter counts and FLOPs per token."""
from __future__ import annotations

from lmforge.config import ModelConfig
from lmforge.model import Transformer

GATED = ("geglu", "geglu-tanh", "swiglu")


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
    context = context or cfg.max_seq_len
    d, dh = cfg.d_model, cfg.head_dim
    q_dim, kv_dim = cfg.n_heads * dh, cfg.kv_heads * dh
    projections = d * q_dim + 2 * d * kv_dim + q_dim * d
    ffn = d * cfg.d_ff * (3 if cfg.ffn in GATED else 2)
    macs = sum(projections + ffn + 2 * _attended_keys(cfg, p, context) * q_dim for p in cfg.layer_patterns())
    if cfg.architecture == "encoder-decoder":
        self_attn = projections + 2 * _attended_keys(cfg, "full", context) * q_dim
        macs += cfg.decoder_layers * (self_attn + ffn + projections + 2 * context * q_dim)
    if cfg.embed_dim != d:
        macs += cfg.embed_dim * d
    if lm_head:
        macs += (d * cfg.embed_dim if cfg.lm_transform else 0) + cfg.embed_dim * cfg.vocab_size
    return 2 * macs


def parameter_counts(model: Transformer) -> dict:
    """Backbone parameters: total, in the token/position tables, and the rest."""
    total = model.num_parameters()
    body = model.num_parameters(embeddings=False)
    return {"total": total, "embeddings": total - body, "non_embedding": body}


def _millions(n: int) -> str:
    return f"{n / 1e6:,.2f}M" if n >= 1e5 else f"{n:,}"


def describe(model: Transformer, context: int | None = None) -> str:
    """A human-readable summary of the model's architecture and cost."""
    cfg = model.config
    context = context or cfg.max_seq_len
    counts = parameter_counts(model)
    flops = flops_per_token(cfg, context)
    kv = cfg.kv_heads
    heads = f"{cfg.n_heads} heads x {cfg.head_dim}" + ("" if kv == cfg.n_heads else
                                                      f", {kv} kv head{'s' * (kv > 1)} ({'MQA' if kv == 1 else 'GQA'})")
    depth = f"{cfg.n_layers}" + (f" + {cfg.decoder_layers} decoder" if cfg.architecture == "encoder-decoder" else "")
    patterns = sorted(set(cfg.layer_patterns()))
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
