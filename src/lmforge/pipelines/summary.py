"""What `lmforge inspect` prints: architecture, parameter counts and FLOPs per token.

Counting never builds a block per layer: a config's parameters are counted on the meta device
for a sample of at most one layer per distinct pattern (plus one), and what one more layer adds
is multiplied out, so `n_layers=100000000` answers in a second with flat memory. What structural
pruning removed (pruned_heads, ffn_sizes) is measured per head and per unit on the same kind of sample
and subtracted. A loaded model directory also gets its heads, and an int8 one its layers and size.
"""
from __future__ import annotations

from collections import Counter
from fractions import Fraction

import torch

from lmforge.config import ModelConfig
from lmforge.config.model import MAX_LEN
from lmforge.config.options import OptionsError
from lmforge.model import from_config
from lmforge.quant.int8 import Int8Linear
from lmforge.quant.int8_embedding import Int8Embedding

GATED = ("geglu", "geglu-tanh", "swiglu")


def pattern_counts(cfg: ModelConfig) -> dict:
    """pattern -> number of layers using it (without a list per layer: n_layers may be huge)."""
    if cfg.attention_schedule:
        return dict(Counter(cfg.attention_schedule))
    return {cfg.attention: cfg.n_layers}


def _window_counts(cfg: ModelConfig) -> dict:
    """(pattern, window) -> number of layers using both: each layer's window is the model's own
    (cfg.layer_window: the window schedule's entry, where there is one, else `window`)."""
    if cfg.window_schedule:  # already a list per layer, so zipping one is no new cost
        return dict(Counter(zip(cfg.layer_patterns(), cfg.window_schedule)))
    return {(pattern, cfg.window): n for pattern, n in pattern_counts(cfg).items()}


def _attended_keys(cfg: ModelConfig, pattern: str, context: int, window: int) -> int | Fraction:
    """Keys a query sees under `pattern` (window `window`) at `context` tokens in layers/patterns.py's masks:
    the last query's (causal) or the middle one's, every d-th key if dilated (causality not discounted)."""
    causal = cfg.architecture == "decoder"  # an encoder-decoder's encoder: its decoder's are full
    step = cfg.dilation if pattern == "dilated" else 1  # a context shorter than the band holds T / d keys
    sides = [min(window // 2, reach // step) for reach in (context // 2, (context - 1) // 2)]
    band = min(window, -(-context // step)) if causal else 1 + sum(sides)
    if pattern in ("sliding-window", "dilated", "longformer"):  # longformer: encoders only
        return min(context, band + (cfg.n_global_tokens if pattern == "longformer" else 0))
    if pattern == "bigbird":
        return _bigbird_keys(cfg, context)
    if pattern == "linformer":  # keys projected along the sequence to k rows, whatever its length
        return cfg.linformer_k
    return context


def _bigbird_keys(cfg: ModelConfig, context: int) -> Fraction:
    """Keys a query sees in BigBird's mask (layers/patterns.bigbird), averaged over the context: the first
    and last (global) blocks see every key; the others their 3-block window, the global blocks and r random
    ones (as many as can be drawn), the second and last but one a window block fewer (a global one)."""
    b, n = cfg.block_size, -(-context // cfg.block_size)
    if context <= cfg.dense_max_len or n <= 3:  # shorter sequences attend fully; or every block is seen
        return Fraction(context)
    last, r = context - (n - 1) * b, cfg.n_random_blocks if cfg.random_block_choice != "first" else 0
    pairs = (b + last) * context + 2 * b * (3 * b + last + min(r, n - 4) * b)
    pairs += (n - 4) * b * (4 * b + last + max(0, min(r, n - 5)) * b)
    return Fraction(pairs, context)


def _extra_macs(cfg: ModelConfig, pattern: str, context: int, q_dim: int, kv_dim: int) -> Fraction:
    """Multiply-adds a token of a `pattern` self-attention (q_dim query, kv_dim key/value features) beside
    its q, k, v, output and keys: Linformer's key and value projections along the sequence (k x T each),
    Longformer's global q, k, v of every token and global rows over every key, XLNet's relative position
    terms (W_r of the 2T - 1 distances, every query against each)."""
    macs = Fraction(0)
    if pattern == "linformer":
        macs += 2 * cfg.linformer_k * kv_dim
    if pattern == "longformer" and cfg.global_projections and cfg.n_global_tokens:  # none: Q_g, K_g, V_g idle
        macs += cfg.d_model * (q_dim + 2 * kv_dim) + 2 * min(cfg.n_global_tokens, context) * q_dim
    if cfg.position == "xl-relative":
        macs += Fraction((2 * context - 1) * (cfg.d_model + context) * q_dim, context)
    return macs


def flops_per_token(cfg: ModelConfig, context: int | None = None, lm_head: bool = True) -> int:
    """Forward FLOPs per token (2 per multiply-add): Kaplan et al. 2020, Table 1, with the
    attention-weighted sum of values counted as well as the logits (as in PaLM, App. B).

    Counts every matrix multiply a token goes through: projections and feed-forward of each
    layer (shared ALBERT layers counted at every use), attention scores and mixing over the
    keys the pattern lets it see (_attended_keys) and the pattern's or position scheme's own
    multiplies (_extra_macs), the embedding projection and the vocabulary projection.
    An encoder-decoder counts one encoder and one decoder token (cross-attention included)."""
    context = cfg.max_seq_len if context is None else context
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"context must be a positive number of tokens, got {context!r}")
    d, dh = cfg.d_model, cfg.head_dim
    q_dim, kv_dim = cfg.n_heads * dh, cfg.kv_heads * dh
    projections = d * q_dim + 2 * d * kv_dim + q_dim * d
    ffn = d * cfg.d_ff * (3 if cfg.ffn in GATED else 2)
    macs = sum(n * (projections + ffn + 2 * _attended_keys(cfg, p, context, w) * q_dim
                    + _extra_macs(cfg, p, context, q_dim, kv_dim))
               for (p, w), n in _window_counts(cfg).items())
    if cfg.architecture == "encoder-decoder":
        self_attn = projections + 2 * context * q_dim  # the decoder's self-attention is full
        macs += cfg.decoder_layers * (self_attn + ffn + projections + 2 * context * q_dim)
    macs -= _pruned_macs(cfg, context)
    if cfg.embed_dim != d:  # each stack embeds its own tokens: an encoder-decoder's decoder projects E -> d
        macs += cfg.embed_dim * d * (2 if cfg.architecture == "encoder-decoder" else 1)
    if lm_head:
        macs += (d * cfg.embed_dim if cfg.lm_transform else 0) + projection_width(cfg) * cfg.vocab_size
    return round(2 * macs)  # XLNet's position terms: a whole forward's, shared out over its tokens


def projection_width(cfg: ModelConfig) -> int:
    """What the vocabulary projection reads per token (heads.LMHead): E after the transform or into the tied
    table, d_model where an untied decoder reads the hidden states without a transform."""
    return cfg.embed_dim if cfg.lm_transform or cfg.tie_embeddings else cfg.d_model


def _pruned_macs(cfg: ModelConfig, context: int) -> Fraction:
    """Multiply-adds per token that pruned heads (cfg.pruned_heads) and FFN units (cfg.ffn_sizes) no
    longer cost: a head's q, k, v and output columns, its scores and mixing and its share of the pattern's
    own multiplies; a unit's W1 (V) and W2 weights."""
    d, dh = cfg.d_model, cfg.head_dim
    macs = sum((cfg.d_ff - n) * d * (3 if cfg.ffn in GATED else 2) for n in (cfg.ffn_sizes or {}).values())
    patterns = cfg.layer_patterns() if cfg.pruned_heads else []  # a list per layer: only when needed
    for key, heads in (cfg.pruned_heads or {}).items():
        attention, _, layer = key.partition(".")
        seq2seq_decoder = attention != "encoder" and cfg.architecture == "encoder-decoder"
        if attention == "cross" or seq2seq_decoder:  # an encoder-decoder's decoder attends to every key
            keys = context
        else:
            pattern = patterns[int(layer)]
            keys = _attended_keys(cfg, pattern, context, cfg.layer_window(int(layer)))
            macs += _extra_macs(cfg, pattern, context, len(heads) * dh, len(heads) * dh)  # MHA only
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
    if cfg.global_projections and "longformer" not in patterns:  # no Longformer layer: none to hold them
        changes["global_projections"] = False
    if cfg.architecture == "encoder-decoder":
        changes["n_decoder_layers"] = decoder_layers
    return cfg.replace(**changes)


def _removed_parameters(cfg: ModelConfig) -> int:
    """Parameters that pruned heads (cfg.pruned_heads) and FFN units (cfg.ffn_sizes) took away: per
    layer, the units (heads) gone times what one unit (head) of that stack (attention and pattern)
    holds, measured on a one-layer sample (the samples index layers from 0, so keys cannot be kept)."""
    base = cfg.replace(pruned_heads=None, ffn_sizes=None)
    costs = {}

    def cost(field: str, stack: str, pattern: str) -> int:  # what one unit or head of one layer holds
        if (field, stack, pattern) not in costs:
            pruned = {"ffn_sizes": {f"{stack}.0": cfg.d_ff - 1}, "pruned_heads": {f"{stack}.0": [0]}}[field]
            sample = _sample(base, [pattern], 1)
            costs[field, stack, pattern] = _meta_counts(sample)[0] - _meta_counts(sample.replace(
                **{field: pruned}))[0]
        return costs[field, stack, pattern]

    removed = 0
    for key, size in (cfg.ffn_sizes or {}).items():
        if size < cfg.d_ff:
            removed += (cfg.d_ff - size) * cost("ffn_sizes", key.partition(".")[0], cfg.attention)
    for key, heads in (cfg.pruned_heads or {}).items():
        attention, _, layer = key.partition(".")
        # an encoder-decoder's decoder layers all have one pattern (layers/stack.py)
        one_pattern = cfg.architecture == "encoder-decoder" and attention != "encoder"
        schedule = cfg.attention_schedule if not one_pattern else None
        pattern = schedule[int(layer)] if schedule else cfg.attention
        removed += len(heads) * cost("pruned_heads", attention, pattern)
    return removed


def config_parameter_counts(cfg: ModelConfig) -> dict:
    """parameter_counts of the model `cfg` describes, at any depth: a sample with one layer per
    pattern, plus (layers - 1) x what one more layer of each pattern (and of the decoder) adds,
    less what pruning removed (_removed_parameters)."""
    removed = _removed_parameters(cfg) if cfg.pruned_heads or cfg.ffn_sizes else 0
    cfg = cfg.replace(pruned_heads=None, ffn_sizes=None)
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
    total, body = total + extra_total - removed, body + extra_body - removed
    return {"total": total, "embeddings": total - body, "non_embedding": body}


def parameter_counts(model) -> dict:
    """Backbone parameters: total, in the token/position tables, and the rest; of a model, or of a
    config (counted without building it: config_parameter_counts)."""
    if isinstance(model, ModelConfig) or model.config.quantization:  # int8 weights are buffers, not counted
        return config_parameter_counts(model if isinstance(model, ModelConfig) else model.config)
    total = model.num_parameters()
    body = model.num_parameters(embeddings=False)
    return {"total": total, "embeddings": total - body, "non_embedding": body}


def _millions(n: int) -> str:
    return f"{n / 1e6:,.2f}M" if n >= 1e5 else f"{n:,}"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'s' * (n != 1)}"


def pruning_summary(cfg: ModelConfig) -> str:
    """What structural pruning left (cfg.pruned_heads, cfg.ffn_sizes), "" when none: heads removed of
    all the attentions' heads, feed-forward units kept of all the layers' units."""
    parts = []
    decoders = cfg.decoder_layers if cfg.architecture == "encoder-decoder" else 0
    pruned = [len(heads) for heads in (cfg.pruned_heads or {}).values() if heads]
    if pruned:
        heads = (cfg.n_layers + 2 * decoders) * cfg.n_heads  # an encoder-decoder's decoder: self + cross
        parts.append(f"heads: {sum(pruned):,} of {heads:,} removed (in {_plural(len(pruned), 'attention')})")
    gone = {key: cfg.d_ff - n for key, n in (cfg.ffn_sizes or {}).items() if n < cfg.d_ff}
    if gone:
        units = (cfg.n_layers + decoders) * cfg.d_ff
        kept = sorted({cfg.d_ff - n for n in gone.values()})
        widths = f"{kept[0]:,}" if len(kept) == 1 else f"{kept[0]:,} to {kept[-1]:,}"
        parts.append(f"feed-forward: {units - sum(gone.values()):,} of {units:,} units kept "
                     f"({_plural(len(gone), 'layer')} pruned to {widths} unit{'s' * (kept[-1] > 1)})")
    return "; ".join(parts)


def elmo_flops(cfg: ModelConfig) -> int:
    """ELMo's forward FLOPs a token (2 a multiply-add), softmax excluded (it serves training only): the
    character CNN over max_characters_per_token positions, the highways, the projection to d_model, and
    each biLSTM layer's two directions (four gates from input and state, the cell projected back)."""
    chars, d, cells = cfg.max_characters_per_token, cfg.d_model, cfg.lstm_dim
    filters = cfg.cnn_filters
    n_filters = sum(n for _, n in filters)
    cnn = sum(2 * width * cfg.char_embed_dim * n * max(0, chars - width + 1) for width, n in filters)
    highway = cfg.n_highway * 2 * n_filters * 2 * n_filters
    lstm = cfg.n_layers * 2 * (2 * 2 * d * 4 * cells + 2 * cells * d)
    return cnn + highway + 2 * n_filters * d + lstm


def _elmo_lines(cfg: ModelConfig, counts: dict) -> list:
    """describe's lines for an ELMo config: a character CNN and a biLSTM, no attention or feed-forward."""
    flops = elmo_flops(cfg)
    widths = ", ".join(f"{n}x{w}" for w, n in cfg.cnn_filters)
    return [
        "architecture   elmo (character CNN + biLSTM language model)",
        f"layers         {cfg.n_layers} biLSTM layers, each direction {cfg.lstm_dim} cells projected to "
        f"d_model={cfg.d_model}",
        f"characters     {cfg.n_characters} embedded in {cfg.char_embed_dim}, up to "
        f"{cfg.max_characters_per_token} a word; CNN filters {widths} (count x width); "
        f"{_plural(cfg.n_highway, 'highway layer')}",
        f"softmax        {cfg.vocab_size:,} words (training only)",
        f"parameters     {_millions(counts['total'])} backbone, "
        f"{_millions(counts['embeddings'])} embeddings, "
        f"{_millions(counts['non_embedding'])} non-embedding",
        f"FLOPs/token    {flops / 1e9:,.3f} GFLOP forward, {3 * flops / 1e9:,.3f} GFLOP training "
        "(softmax excluded)",
    ]


def check_context(cfg: ModelConfig, context) -> None:
    """An OptionsError naming context where the FLOPs cannot be counted at it: no count of tokens, past the
    model's max_seq_len, or given for an ELMo (a biLSTM: its FLOPs per token do not depend on it)."""
    if context is None:
        return
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise OptionsError(f"context {context!r}: the context must be at least 1 token", "context")
    if cfg.architecture == "elmo":
        raise OptionsError(f"context {context}: an ELMo's FLOPs per token do not depend on the context (a "
                           "biLSTM, no attention); drop it", "context")
    if context > cfg.max_seq_len:
        more = (f"add max_seq_len={context} to count a longer context" if context <= MAX_LEN
                else f"no model's is over {MAX_LEN}")  # not a hint the config would refuse
        raise OptionsError(f"context {context} exceeds max_seq_len={cfg.max_seq_len} ({more})", "context")


def describe(model, context: int | None = None) -> str:
    """A human-readable summary of the architecture and cost of a model or a config (any size) at
    `context` tokens (default its max_seq_len; check_context's refusals)."""
    cfg = model if isinstance(model, ModelConfig) else model.config
    check_context(cfg, context)
    context = cfg.max_seq_len if context is None else context
    counts = parameter_counts(model)
    if cfg.architecture == "elmo":
        return "\n".join(_elmo_lines(cfg, counts) + ([f"source         {cfg.source}"] if cfg.source else []))
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
        f"parameters     {_millions(counts['total'])} backbone, "
        f"{_millions(counts['embeddings'])} embeddings, "
        f"{_millions(counts['non_embedding'])} non-embedding",
        *([f"pruned         {pruning_summary(cfg)}"] if pruning_summary(cfg) else []),
        f"FLOPs/token    {flops / 1e9:,.3f} GFLOP forward, {3 * flops / 1e9:,.3f} GFLOP training "
        f"(context {context})",
    ]
    if cfg.source:
        lines.append(f"source         {cfg.source}")
    return "\n".join(lines)


def _sizes(*sizes: int) -> list:
    """Byte counts in one unit (MiB, KiB or bytes, as the largest needs)."""
    units = ((2**20, "MiB"), (2**10, "KiB"), (1, "bytes"))
    unit, name = next((u, n) for u, n in units if max(sizes) >= 10 * u or u == 1)
    return [f"{n / unit:,.2f} {name}" if unit > 1 else f"{n:,} bytes" for n in sizes]


def model_bytes(model) -> tuple:
    """(bytes its tensors hold, bytes they would hold with every int8 weight in fp32): a tied tensor
    counted once; an int8 layer's scales and smoothing factors have no fp32 counterpart."""
    held = {t.data_ptr(): t.numel() * t.element_size() for t in model.state_dict().values()}
    fp32 = sum(held.values())
    for m in model.modules():
        if isinstance(m, (Int8Linear, Int8Embedding)):
            extras = [t for t in (m.scale, getattr(m, "smooth", None)) if t is not None]
            fp32 += 3 * m.qweight.numel() - sum(t.numel() * t.element_size() for t in extras)
    return sum(held.values()), fp32


def quantization_summary(model) -> list:
    """Lines on an int8-quantised model (compress/quantize.py; [] for an fp32 one): its mode and
    scheme, the Linears and token table held int8, SmoothQuant's smoothing, and its size against fp32."""
    q = model.config.quantization
    if not q:
        return []
    int8 = [m for m in model.modules() if isinstance(m, Int8Linear)]
    linears = len(int8) + sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    kept = f" ({', '.join(q.get('kept_fp32', []))} kept fp32)" if q.get("kept_fp32") else ""
    table = "int8" if any(isinstance(m, Int8Embedding) for m in model.modules()) else "fp32"
    smoothing = q.get("smoothing")
    smoothed = "none" if not smoothing else (f"SmoothQuant alpha={smoothing.get('alpha')} on "
                                             f"{_plural(len(smoothing['layers']), 'layer')} "
                                             f"(calibration: {smoothing.get('calibration', '?')})")
    held, fp32 = model_bytes(model)
    held_text, fp32_text = _sizes(held, fp32)
    return [f"int8           {q['mode']} ({q.get('scheme', 'int8')}): {len(int8)} of {linears} Linear "
            f"layers int8{kept}; token table {table}",
            f"smoothing      {smoothed}",
            f"size           {held_text} of tensors (heads included), {fp32_text} in fp32: "
            f"{fp32 / max(held, 1):.2f}x smaller"]


def head_weights(model) -> dict:
    """Head name -> the weights it adds to the backbone (int8 ones included; a tied table not again)."""
    backbone = {id(p) for n, p in model.named_parameters() if not n.startswith("heads.")}
    out = {}
    for name, head in model.heads.items():
        int8 = [m for m in head.modules() if isinstance(m, Int8Linear)]
        out[name] = (sum(p.numel() for p in head.parameters() if id(p) not in backbone)
                     + sum(m.qweight.numel() + (m.bias.numel() if m.bias is not None else 0) for m in int8))
    return out


def heads_summary(model, backbone: int) -> list:
    """A line naming a model's heads and their weights, and the total with the `backbone`'s ([]: none)."""
    weights = head_weights(model)
    if not weights:
        return []
    kinds = {name: model.heads[name].spec["kind"] for name in weights}
    heads = ", ".join(f"{name}{'' if kinds[name] == name else f' ({kinds[name]})'} {n:,}"
                      for name, n in weights.items())
    return [f"heads          {heads} ({backbone + sum(weights.values()):,} parameters with the backbone)"]
