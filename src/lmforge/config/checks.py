"""ModelConfig's rules that read a few fields each (config/model.py calls them): the error type, windows,
rotary scaling, pruned heads, FFN sizes, quantization, attention patterns, the tied LM head's width (heads.py
calls that one), and which fields have no effect (inert_fields) so an override of one is refused
(refuse_inert). Each field's type, bounds and choices are its declaration's (check_options). No import of
config/model.py, which imports this."""
from __future__ import annotations

import dataclasses

from lmforge.config.options import OptionsError
from lmforge.utils.errors import shown

MAX_WIDTH = 2 ** 16  # a width's bound: d_model, a head's, the character CNN's filters in all

# position schemes with a term per head: a pruned layer would need its own slice of them
PER_HEAD_POSITIONS = ("relative-bias", "alibi", "xl-relative")


class ConfigError(OptionsError):
    """An invalid ModelConfig field; the message names the field and the valid choices."""


def validate_windows(cfg) -> None:
    """A window_schedule has a positive window per layer of an encoder or a decoder."""
    if cfg.window_schedule is None:
        return
    if cfg.architecture == "encoder-decoder":  # its decoder stack can be deeper than the schedule
        raise ConfigError("window_schedule is supported for architecture='encoder' and 'decoder' only",
                          "window_schedule")
    if len(cfg.window_schedule) != cfg.n_layers:
        raise ConfigError(f"window_schedule has {len(cfg.window_schedule)} entries but "
                          f"n_layers={cfg.n_layers}", "window_schedule")
    for w in cfg.window_schedule:
        if not isinstance(w, int) or isinstance(w, bool) or w < 1:
            raise ConfigError(f"window_schedule entry {w!r} must be a positive integer", "window_schedule")


def validate_rotary_scaling(cfg) -> None:
    """llama3's frequency factors bound a band (the fields' own bounds are checked with their types)."""
    if cfg.rotary_scaling == "llama3" and not 0 < cfg.rotary_low_freq_factor < cfg.rotary_high_freq_factor:
        raise ConfigError(f"rotary_low_freq_factor={cfg.rotary_low_freq_factor} and rotary_high_freq_factor="
                          f"{cfg.rotary_high_freq_factor} must satisfy 0 < low < high",
                          "rotary_low_freq_factor")


def validate_pruned(cfg) -> None:
    """pruned_heads names attentions the architecture has, layers it has, and leaves each a head."""
    if not cfg.pruned_heads:
        return
    if not isinstance(cfg.pruned_heads, dict):  # pruned_heads=x on the command line reads as a string
        raise ConfigError(f"pruned_heads must map layers to head lists, e.g. {{\"encoder.0\": [1, 3]}}, got "
                          f"{shown(cfg.pruned_heads)}", "pruned_heads")
    if cfg.share_layers or cfg.kv_heads != cfg.n_heads or cfg.position in PER_HEAD_POSITIONS:
        raise ConfigError("pruned_heads needs separate layers, n_kv_heads = n_heads and no per-head position "
                          f"terms (not {', '.join(PER_HEAD_POSITIONS)}); mask those heads instead",
                          "pruned_heads")
    for key, heads in cfg.pruned_heads.items():
        _layer_key(cfg, "pruned_heads", key, ("encoder", "decoder", "cross"))
        if (not isinstance(heads, list) or len(set(heads)) != len(heads)
                or not all(type(h) is int and 0 <= h < cfg.n_heads for h in heads)):
            raise ConfigError(f"pruned_heads[{key!r}] must list distinct heads in 0..{cfg.n_heads - 1}",
                              "pruned_heads")
        if len(heads) >= cfg.n_heads:
            raise ConfigError(f"pruned_heads[{key!r}] removes every head of the layer: keep at least one",
                              "pruned_heads")


def validate_lm_head(cfg) -> None:
    """A tied LM head reads features as wide as the token table: with a factorised embedding (E != d_model)
    only its transform (dense d_model -> E, ALBERT's and ELECTRA's generator's) makes them so. heads.LMHead
    calls it: a model of such a config without an LM head (a classifier, an RTD discriminator) is valid."""
    if cfg.tie_embeddings and not cfg.lm_transform and cfg.embed_dim != cfg.d_model:
        # else a shape mismatch inside the head's matmul at the first forward
        raise ConfigError(f"tie_embeddings=True with d_embed={cfg.d_embed} != d_model={cfg.d_model} needs "
                          "lm_transform=True (it projects d_model -> E, as ALBERT's head); or set "
                          "tie_embeddings=False or d_embed=null", "tie_embeddings")


# ELMo's character ids (tokenizer/chars.py): 256 bytes, 4 marks and a padding character, shifted by one
ELMO_CHARACTERS = 262


def validate_elmo(cfg) -> None:
    """ELMo's sizes: positive widths, [width, n_filters] pairs that fit a word, >= 0 highway layers,
    positive clipping values (or none)."""
    for name, least, why in (("n_characters", ELMO_CHARACTERS, "the ids tokenizer/chars.py gives"),
                             ("max_characters_per_token", 3, "a sentence mark between the word marks")):
        if getattr(cfg, name) < least:  # else word_layers fails mid-way (an IndexError, a ragged tensor)
            raise ConfigError(f"{name}={getattr(cfg, name)} must be at least {least}: {why}", name)
    pairs = cfg.char_filters
    if pairs is not None and not (isinstance(pairs, list) and pairs and all(
            isinstance(f, list) and len(f) == 2 and all(type(n) is int and n > 0 for n in f) for f in pairs)):
        raise ConfigError(f"char_filters={shown(pairs)} must be a non-empty list of [width, n_filters] pairs "
                          f"of positive integers", "char_filters")
    widest = max(width for width, _ in cfg.cnn_filters)
    if widest > cfg.max_characters_per_token:
        raise ConfigError(f"char_filters has a width {widest} > max_characters_per_token="
                          f"{cfg.max_characters_per_token}", "char_filters")
    total = sum(n for _, n in cfg.cnn_filters)  # the CNN's output width (the original's: 2048)
    if total > MAX_WIDTH:
        raise ConfigError(f"char_filters has {total} filters in all, more than {MAX_WIDTH} (the character "
                          f"CNN's output width, bounded as d_model is)", "char_filters")


def _stacks(cfg) -> dict:
    """Attention or stack name -> its number of layers ("cross" for an encoder-decoder's decoder)."""
    if cfg.architecture != "encoder-decoder":
        return {cfg.architecture: cfg.n_layers}
    return {"encoder": cfg.n_layers, "decoder": cfg.decoder_layers, "cross": cfg.decoder_layers}


def _layer_key(cfg, field: str, key, names) -> None:
    """`key` is "stack.layer" (a stack of `names` the architecture has, a layer it has), or ConfigError."""
    stacks = _stacks(cfg)
    name, _, layer = str(key).partition(".")
    if name not in names or name not in stacks or not layer.isdigit() or int(layer) >= stacks[name]:
        valid = [f"{n}.0" + (f" to {n}.{stacks[n] - 1}" if stacks[n] > 1 else "")
                 for n in names if n in stacks]
        depth = ""  # a stack it has, too few layers: the layer count (an override, often) is named
        if name in names and name in stacks and layer.isdigit():
            decoder = cfg.architecture == "encoder-decoder" and name != "encoder"
            count = "n_decoder_layers" if decoder else "n_layers"
            depth = (f": {count}={stacks[name]} leaves no layer {int(layer)} "
                     "(per-layer fields follow their layers)")
        raise ConfigError(f"{field} key {key!r} names no layer of this {cfg.architecture} model "
                          f"(keys are {' or '.join(valid)}){depth}", field)


def validate_ffn_sizes(cfg) -> None:
    """ffn_sizes names layers the model has, each keeping between 1 and d_ff hidden units."""
    if not cfg.ffn_sizes:
        return
    if cfg.share_layers:
        raise ConfigError("ffn_sizes needs separate layers (share_layers=False): one block serves every "
                          "layer",
                          "ffn_sizes")
    for key, size in cfg.ffn_sizes.items():
        _layer_key(cfg, "ffn_sizes", key, ("encoder", "decoder"))
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= cfg.d_ff:
            raise ConfigError(f"ffn_sizes[{key!r}]={size!r} must be an integer in 1..d_ff={cfg.d_ff}",
                              "ffn_sizes")


QUANTIZATION_MODES = ("dynamic", "weight-only")


def validate_quantization(cfg) -> None:
    """quantization is null or a mapping whose "mode" is one of QUANTIZATION_MODES."""
    q, modes = cfg.quantization, " or ".join(QUANTIZATION_MODES)
    if q is not None and not isinstance(q, dict):
        raise ConfigError(f"quantization={shown(q)} must be null or a mapping with \"mode\": {modes}",
                          "quantization")
    if q is not None and q.get("mode") not in QUANTIZATION_MODES:  # the bad value, not the whole mapping
        raise ConfigError(f"quantization mode {shown(q.get('mode'))} is not {modes}", "quantization")
    smoothing = (q or {}).get("smoothing")
    if smoothing is not None:
        layers = smoothing.get("layers") if isinstance(smoothing, dict) else None
        names = isinstance(layers, list) and all(isinstance(name, str) for name in layers)
        if q["mode"] != "dynamic":
            raise ConfigError(f"quantization.smoothing is for mode dynamic, not {q['mode']}", "quantization")
        if not names:
            raise ConfigError(f"quantization.smoothing.layers={shown(layers)} must list Linear names",
                              "quantization")


def pattern_set(cfg) -> set:
    """The patterns the layers use, without a list per layer (n_layers may be huge: `inspect`)."""
    return set(cfg.attention_schedule) if cfg.attention_schedule else {cfg.attention}


def validate_patterns(cfg, patterns: tuple, bidirectional_only: tuple) -> None:
    """The attention schedule names known patterns, one per layer, that the architecture allows, with
    windows, blocks and projections that fit max_seq_len."""
    given = cfg.attention_schedule
    if given is not None and not (isinstance(given, list) and all(isinstance(s, str) for s in given)):
        raise ConfigError(f"attention_schedule must be a list of pattern names, got {shown(given)}",
                          "attention_schedule")
    schedule = pattern_set(cfg)
    if cfg.attention_schedule and len(cfg.attention_schedule) != cfg.n_layers:
        raise ConfigError(f"attention_schedule has {len(cfg.attention_schedule)} entries but "
                          f"n_layers={cfg.n_layers}", "attention_schedule")
    for pattern in sorted(schedule):
        if pattern not in patterns:
            raise ConfigError(f"attention_schedule entry {pattern!r} is not one of {', '.join(patterns)}",
                              "attention_schedule")
        if pattern in bidirectional_only and cfg.architecture == "decoder":
            raise ConfigError(f"attention={pattern!r} needs bidirectional attention; "
                              f"architecture='decoder' supports full, sliding-window, dilated", "attention")
    if cfg.share_layers and len(schedule) > 1:
        raise ConfigError("share_layers=True needs one attention pattern for every layer", "share_layers")
    windowed = {"sliding-window", "dilated", "longformer"} & schedule
    validate_windows(cfg)
    widest = max(cfg.window_schedule or [cfg.window])
    if windowed and widest > cfg.max_seq_len:
        raise ConfigError(f"window={widest} is larger than max_seq_len={cfg.max_seq_len}", "window")
    if "bigbird" in schedule and cfg.block_size * 3 > cfg.max_seq_len:
        raise ConfigError(f"block_size={cfg.block_size} needs max_seq_len >= 3 blocks "
                          f"({3 * cfg.block_size}), got {cfg.max_seq_len}", "block_size")
    if "linformer" in schedule and cfg.linformer_k > cfg.max_seq_len:
        raise ConfigError(f"linformer_k={cfg.linformer_k} exceeds max_seq_len={cfg.max_seq_len}",
                          "linformer_k")
    if "linformer" in schedule and cfg.position in ("relative-bias", "alibi", "xl-relative"):
        # projected keys no longer have positions for a (query, key) bias to refer to
        raise ConfigError(f"attention='linformer' cannot use position={cfg.position!r}; "
                          f"use learned, sinusoidal, rotary or none", "position")
    if cfg.global_projections and "longformer" not in schedule:
        raise ConfigError("global_projections=True needs attention='longformer'", "global_projections")


def within_context(name: str, tokens: int | None, cfg) -> None:
    """An OptionsError naming `name` where `tokens` (None: the model's own) are more positions than a model
    of config `cfg` reads (its max_seq_len)."""
    if tokens is not None and tokens > cfg.max_seq_len:
        raise OptionsError(f"{name}={tokens}: more tokens than the model reads "
                           f"(max_seq_len={cfg.max_seq_len})", name)


def room_for_text(name: str, tokens: int | None, cfg, specials: int) -> None:
    """within_context, and room for a token of text beside the `specials` special tokens a text is framed
    with (a shorter cut would hold none of its own): an OptionsError naming `name` otherwise."""
    within_context(name, tokens, cfg)
    if tokens is not None and tokens <= specials:
        raise OptionsError(f"{name}={tokens} leaves no room next to the model's {specials} special tokens",
                           name)


# ELMo's own fields: layers/variants/elmo.py and elmo.py read them, no Transformer does
ELMO_FIELDS = ("char_embed_dim", "char_filters", "n_highway", "lstm_dim", "cell_clip", "proj_clip",
               "n_characters", "max_characters_per_token", "skip_connections", "stateful")
# the Transformer stacks' fields: neither elmo.py, layers/variants/elmo.py nor ELMo's softmax reads them (an
# LM head: it reads lm_*, norm, norm_eps, norm_bias, tie_embeddings, d_embed and, with its transform, ffn)
TRANSFORMER_FIELDS = ("n_heads", "n_kv_heads", "d_head", "d_ff", "n_segments", "position", "position_offset",
                      "position_from_padding", "scale_embeddings", "embedding_norm", "norm_placement",
                      "final_norm", "ffn_bias", "attention_bias", "attention_scaling", "attention",
                      "attention_schedule", "attention_dropout", "share_layers", "pruned_heads", "ffn_sizes")
# each pattern's own fields (the windowed patterns' are WINDOW_FIELDS)
PATTERN_FIELDS = {"longformer": ("n_global_tokens", "global_projections"),
                  "bigbird": ("block_size", "n_random_blocks", "random_block_choice", "dense_max_len"),
                  "linformer": ("linformer_k",)}
WINDOW_FIELDS = ("window", "dilation", "window_schedule")
ROTARY_FIELDS = ("rotary_theta", "rotary_dim", "rotary_scaling")
LLAMA3_FIELDS = ("rotary_low_freq_factor", "rotary_high_freq_factor", "rotary_original_max_len")
RELATIVE_FIELDS = ("relative_buckets", "relative_max_distance")
LEARNED_FIELDS = ("position_offset", "position_from_padding")


def _inert_patterns(cfg) -> dict:
    """Attention-pattern fields of no effect: those of patterns no layer uses, `window` under a schedule."""
    patterns, inert = pattern_set(cfg), {}
    if not patterns & {"sliding-window", "dilated", "longformer"}:
        inert.update(dict.fromkeys(WINDOW_FIELDS, "no layer's attention is windowed "
                                   "(attention='sliding-window', 'dilated' or 'longformer')"))
    elif cfg.window_schedule:  # layer_window reads the schedule alone, one window for all included
        inert["window"] = "window_schedule sets each layer's window (window_schedule=null)"
    for pattern, names in PATTERN_FIELDS.items():
        if pattern not in patterns:
            inert.update(dict.fromkeys(names, f"no layer's attention is {pattern} (attention={pattern!r})"))
    return inert


def _inert_positions(cfg) -> dict:
    """Position fields of no effect under the config's scheme (rotary's when not rotary, ...)."""
    inert = {}
    if cfg.position != "rotary":
        inert.update(dict.fromkeys(ROTARY_FIELDS, "positions are not rotary (position='rotary')"))
    if cfg.position != "rotary" or cfg.rotary_scaling != "llama3":
        inert.update(dict.fromkeys(LLAMA3_FIELDS, "no llama3 scaling (position='rotary', "
                                                  "rotary_scaling='llama3')"))
        if cfg.position != "rotary" or cfg.rotary_scaling == "none":
            inert["rotary_scaling_factor"] = ("no rotary scaling (position='rotary', rotary_scaling="
                                              "'linear' or 'llama3')")
    if cfg.position != "relative-bias":
        inert.update(dict.fromkeys(RELATIVE_FIELDS, "positions are not relative-bias "
                                                    "(position='relative-bias')"))
    if cfg.position != "learned":
        inert.update(dict.fromkeys(LEARNED_FIELDS, "positions are not learned (position='learned')"))
    return inert


def layout_inert(cfg) -> dict:
    """Field -> what gives it an effect, for each field of no effect under `cfg` that canonical() resets:
    those of unused patterns and positions, lm_activation without a transform (but on a tied encoder), ELMo's
    on a Transformer."""
    inert = {**_inert_patterns(cfg), **_inert_positions(cfg)}
    # a tied encoder's is read all the same: ELECTRA's generator built from it (objectives/rtd.py's
    # generator_config) takes a transform, whose activation it is
    if not cfg.lm_transform and not (cfg.architecture == "encoder" and cfg.tie_embeddings):
        inert["lm_activation"] = "the LM head has no transform (lm_transform=True)"
    if cfg.architecture != "elmo":
        inert.update(dict.fromkeys(ELMO_FIELDS, "it is ELMo's (architecture='elmo')"))
    return inert


# a field of no effect at the value the model acts as if it had, where that is not the field's default:
# refuse_inert takes it as not set (tie_embeddings=False, what an ELMo's softmax is, whatever the field says)
NOT_SET = {"elmo": {"tie_embeddings": False}}


def kept_inert(cfg) -> dict:
    """Fields of no effect that canonical() keeps as given, its results (runs' recorded identities) being
    older than their rule: dilation without a dilated layer; on an ELMo, the Transformer's, tie_embeddings,
    tied_logit_scale."""
    inert = {}
    if "dilated" not in pattern_set(cfg):  # layers/patterns.py: only dilated() reads it
        inert["dilation"] = "no layer's attention is dilated (attention='dilated')"
    if cfg.architecture != "elmo":
        return inert
    names = [*TRANSFORMER_FIELDS, *WINDOW_FIELDS, *sum(PATTERN_FIELDS.values(), ()), *ROTARY_FIELDS,
             *LLAMA3_FIELDS, "rotary_scaling_factor", *RELATIVE_FIELDS]
    if not cfg.lm_transform:  # else the LM head's activation (lm_activation null: ffn's)
        names.append("ffn")
    # heads.LMHead unties an ELMo's softmax; kept, as reset to the default (True) it would change the identity
    # of every ELMo run (its presets record False)
    inert["tie_embeddings"] = ("ELMo reads characters: its softmax has no token table to tie to "
                               "(architecture='encoder', 'decoder' or 'encoder-decoder')")
    # heads.LMHead scales no ELMo's softmax; kept, as an ELMo made from T5's fields records True
    inert["tied_logit_scale"] = ("ELMo's softmax has no logit scale (architecture='encoder', 'decoder' or "
                                 "'encoder-decoder')")
    return {**inert, **dict.fromkeys(names, "it is the Transformer's (architecture='encoder', 'decoder' or "
                                            "'encoder-decoder')")}


def inert_fields(cfg) -> dict:
    """Field -> what would give it an effect, for every field of no effect on the model `cfg` describes."""
    return {**layout_inert(cfg), **kept_inert(cfg)}  # on an ELMo, "the Transformer's" says it best


def refuse_inert(cfg, names) -> None:
    """A ConfigError naming the first of `names` (fields a caller set explicitly) of no effect on the model
    `cfg` describes at a value other than its default (or NOT_SET's): an override that would do nothing."""
    inert, defaults = inert_fields(cfg), {f.name: f.default for f in dataclasses.fields(cfg)}
    defaults.update(NOT_SET.get(cfg.architecture, {}))  # tie_embeddings=True on an ELMo: a request refused
    for name in names:
        value = getattr(cfg, name, None)
        if name in inert and value != defaults[name]:
            raise ConfigError(f"{name}={shown(value)} has no effect on this {cfg.architecture!r} model: "
                              f"{inert[name]}", name)
