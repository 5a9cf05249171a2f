"""ModelConfig: one flat, typed, validated description of any Transformer LM.

Every architectural axis of DESIGN.md is one field here; its value selects a
small module through a module-level dict in `lmforge.layers`. Invalid values
raise `ConfigError` with a one-line message naming the field and the choices.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

ARCHITECTURES = ("encoder", "decoder", "encoder-decoder")
POSITIONS = ("learned", "sinusoidal", "relative-bias", "alibi", "rotary", "xl-relative", "none")
NORMS = ("layernorm", "rmsnorm")
PLACEMENTS = ("post", "pre")
FFNS = ("relu", "gelu", "gelu-tanh", "geglu", "geglu-tanh", "swiglu")
PATTERNS = ("full", "sliding-window", "dilated", "longformer", "bigbird", "linformer")
ROTARY_SCALINGS = ("none", "linear", "llama3")  # how RoPE frequencies are stretched for longer contexts
RANDOM_BLOCK_CHOICES = ("seeded", "first")  # BigBird
# BERT/RoBERTa/ALBERT, DistilBERT, ELECTRA, BigBird (its classification head uses hidden_act)
POOLER_ACTIVATIONS = ("tanh", "relu", "gelu", "gelu-tanh")
LM_ACTIVATIONS = ("relu", "gelu", "gelu-tanh")
_FFN_ACTIVATION = {"geglu": "gelu", "geglu-tanh": "gelu-tanh"}  # inside the gated ones; others: own name
# Patterns whose definition needs every token to see the whole sequence's layout
# (global tokens, random blocks, projections over the length): encoder-side only.
BIDIRECTIONAL_ONLY = ("longformer", "bigbird", "linformer")


SPECIAL_TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
                  "forced_bos_token_id", "forced_eos_token_id")


class ConfigError(ValueError):
    """An invalid ModelConfig field; the message names the field and the valid choices."""


@dataclass
class ModelConfig:
    """All hyper-parameters of one model, named as in the papers (Vaswani et al. 2017 onwards)."""

    architecture: str = "encoder"
    vocab_size: int = 30522
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    n_kv_heads: Optional[int] = None  # None: = n_heads (MHA); 1: MQA; else GQA
    d_head: Optional[int] = None  # None: d_model // n_heads
    d_ff: int = 3072
    n_decoder_layers: Optional[int] = None  # encoder-decoder only; None: = n_layers
    max_seq_len: int = 512
    dropout: float = 0.1
    attention_dropout: float = 0.1
    # embeddings
    d_embed: Optional[int] = None  # ALBERT/ELECTRA factorised embedding size E; None: d_model
    n_segments: int = 2  # token-type embeddings; 0 for none
    position: str = "learned"
    position_offset: int = 0  # RoBERTa/BART start learned positions at 2
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model)
    embedding_norm: bool = True  # BERT's LayerNorm after the embedding sum
    tie_embeddings: bool = True  # LM head reuses the token embedding matrix
    # position-scheme parameters
    rotary_theta: float = 10000.0
    rotary_dim: Optional[int] = None  # partial rotary; None: d_head
    rotary_scaling: str = "none"  # "linear": every frequency / factor; "llama3": by wavelength
    rotary_scaling_factor: float = 1.0
    rotary_low_freq_factor: float = 1.0  # llama3: wavelengths > original/low are divided by the factor
    rotary_high_freq_factor: float = 4.0  # llama3: wavelengths < original/high are kept
    rotary_original_max_len: int = 8192  # llama3: the context length the base frequencies were trained on
    relative_buckets: int = 32
    relative_max_distance: int = 128
    # normalisation
    norm: str = "layernorm"
    norm_placement: str = "post"
    norm_eps: float = 1e-12
    norm_bias: bool = True
    final_norm: Optional[bool] = None  # None: True for pre-norm, False for post-norm
    # sub-layers
    ffn: str = "gelu"
    ffn_bias: bool = True
    attention_bias: bool = True
    attention_scaling: bool = True  # divide scores by sqrt(d_head); T5 folds it into init
    # attention pattern
    attention: str = "full"
    attention_schedule: Optional[list] = None  # per-layer pattern names; None: all `attention`
    window: int = 512  # total width: |i-j| <= window//2 (bidirectional), i-window < j <= i (causal)
    window_schedule: Optional[list] = None  # per-layer windows (Longformer sec. 3.1); None: `window`
    dilation: int = 1
    n_global_tokens: int = 1  # longformer default global tokens when none are given ([CLS])
    global_projections: bool = False  # Longformer's separate q/k/v for global attention
    block_size: int = 64  # BigBird
    n_random_blocks: int = 3  # BigBird
    # BigBird: "seeded" draws the random blocks per layer; "first" puts every draw on the first block,
    # which then counts 1 + n_random_blocks times (the reference library's inference-time layout)
    random_block_choice: str = "seeded"
    dense_max_len: int = 0  # BigBird: sequences of at most this many tokens attend fully; 0: never
    linformer_k: int = 256  # Linformer projected length
    # parameter economy
    share_layers: bool = False  # ALBERT cross-layer sharing
    # LM head (heads.py reads these so a preset describes its family's head)
    lm_transform: bool = True  # BERT's dense + activation + norm before the vocabulary projection
    lm_bias: bool = True
    tied_logit_scale: bool = False  # T5 v1.0 scales by d_model**-0.5 before a tied projection
    lm_activation: Optional[str] = None  # the transform's activation; None: ffn's (RoBERTa: always gelu)
    pooler_activation: str = "tanh"  # of the pooled [CLS] dense layer (DistilBERT relu, ELECTRA gelu)
    # special token ids (generation, padding); no effect on the architecture
    pad_token_id: Optional[int] = None
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    decoder_start_token_id: Optional[int] = None  # encoder-decoders: first decoder input
    forced_bos_token_id: Optional[int] = None  # generation: the first new token (mBART's language id)
    forced_eos_token_id: Optional[int] = None  # generation: the token at the maximum length (BART)
    source: str = ""  # where a preset's numbers come from

    def __post_init__(self) -> None:
        if isinstance(self.attention_schedule, tuple):
            self.attention_schedule = list(self.attention_schedule)
        if isinstance(self.window_schedule, tuple):
            self.window_schedule = list(self.window_schedule)
        _validate(self)

    # derived sizes -----------------------------------------------------------
    @property
    def head_dim(self) -> int:
        """Per-head width."""
        return self.d_head or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads (GQA/MQA share them across query heads)."""
        return self.n_kv_heads or self.n_heads

    @property
    def embed_dim(self) -> int:
        """Width of the embedding layer (E in ALBERT)."""
        return self.d_embed or self.d_model

    @property
    def decoder_layers(self) -> int:
        """Decoder depth of an encoder-decoder."""
        return self.n_decoder_layers or self.n_layers

    @property
    def has_final_norm(self) -> bool:
        """Whether the stack ends with a norm (pre-norm models need one)."""
        return self.norm_placement == "pre" if self.final_norm is None else self.final_norm

    @property
    def rotary_width(self) -> int:
        """Number of leading head dimensions that rotary rotates."""
        return self.rotary_dim or self.head_dim

    def layer_patterns(self) -> list:
        """Attention pattern of each layer (the schedule, or `attention` everywhere)."""
        return list(self.attention_schedule or [self.attention] * self.n_layers)

    def layer_window(self, layer: int) -> int:
        """Window width of one layer (the window schedule, or `window`)."""
        return self.window_schedule[layer] if self.window_schedule else self.window

    def canonical(self) -> "ModelConfig":
        """A copy with every field that has no effect here reset to its default (and no source),
        so two configs of the same architecture compare equal."""
        patterns = set(self.layer_patterns())
        inert = {"source", *SPECIAL_TOKENS}
        if not patterns & {"sliding-window", "dilated", "longformer"}:
            inert |= {"window", "dilation", "window_schedule"}
        elif self.window_schedule and len(set(self.window_schedule)) > 1:
            inert.add("window")
        if "longformer" not in patterns:
            inert |= {"n_global_tokens", "global_projections"}
        if "bigbird" not in patterns:
            inert |= {"block_size", "n_random_blocks", "random_block_choice", "dense_max_len"}
        if "linformer" not in patterns:
            inert.add("linformer_k")
        if self.position != "rotary":
            inert |= {"rotary_theta", "rotary_dim", "rotary_scaling"}
        if self.position != "rotary" or self.rotary_scaling != "llama3":
            inert |= {"rotary_low_freq_factor", "rotary_high_freq_factor", "rotary_original_max_len"}
            if self.position != "rotary" or self.rotary_scaling == "none":
                inert.add("rotary_scaling_factor")
        if self.position != "relative-bias":
            inert |= {"relative_buckets", "relative_max_distance"}
        if self.position != "learned":
            inert.add("position_offset")
        if not self.lm_transform or self.lm_activation == _FFN_ACTIVATION.get(self.ffn, self.ffn):
            inert.add("lm_activation")
        defaults = {f.name: f.default for f in fields(self) if f.name in inert}
        if self.n_kv_heads == self.n_heads:  # explicit MHA is the default MHA
            defaults["n_kv_heads"] = None
        if "window_schedule" not in inert and self.window_schedule and len(set(self.window_schedule)) == 1:
            defaults.update(window=self.window_schedule[0], window_schedule=None)  # one window for all
        if "dense_max_len" not in inert and self.dense_max_len > self.max_seq_len:
            defaults["dense_max_len"] = self.max_seq_len  # dense at every length either way
        # sizes set to the value they default to anyway (T5's d_kv = d_model / n_heads)
        if self.d_head is not None and self.d_head * self.n_heads == self.d_model:
            defaults["d_head"] = None
        if self.n_decoder_layers == self.n_layers:
            defaults["n_decoder_layers"] = None
        return self.replace(**defaults)

    # (de)serialisation --------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain JSON-able dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        """Build from a dict, rejecting unknown keys by name."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s) {unknown}; valid fields: {sorted(known)}")
        return cls(**data)

    def replace(self, **overrides: Any) -> "ModelConfig":
        """A validated copy with some fields changed."""
        return self.from_dict({**self.to_dict(), **overrides})

    def save(self, path: str | os.PathLike) -> None:
        """Write as JSON, atomically."""
        atomic_write_text(Path(path), json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ModelConfig":
        """Read a JSON file written by `save`."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def atomic_write_text(path: Path, text: str) -> None:
    """Write text to a temporary file in the same folder, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _choice(cfg: ModelConfig, name: str, choices: tuple) -> None:
    value = getattr(cfg, name)
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(choices)}")


def _positive(cfg: ModelConfig, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{name}={value!r} must be a positive integer")


def _validate(cfg: ModelConfig) -> None:
    for name, choices in (("architecture", ARCHITECTURES), ("position", POSITIONS), ("norm", NORMS),
                          ("norm_placement", PLACEMENTS), ("ffn", FFNS), ("attention", PATTERNS),
                          ("pooler_activation", POOLER_ACTIVATIONS),
                          ("random_block_choice", RANDOM_BLOCK_CHOICES)):
        _choice(cfg, name, choices)
    if cfg.lm_activation is not None:
        _choice(cfg, "lm_activation", LM_ACTIVATIONS)
    _positive(cfg, "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_head", "d_ff",
              "n_decoder_layers", "max_seq_len", "d_embed", "window", "dilation", "block_size",
              "relative_buckets", "relative_max_distance", "linformer_k")
    for name in ("dropout", "attention_dropout"):
        if not 0.0 <= getattr(cfg, name) < 1.0:
            raise ConfigError(f"{name}={getattr(cfg, name)!r} must be in [0, 1)")
    if (cfg.n_segments < 0 or cfg.position_offset < 0 or cfg.n_random_blocks < 0 or cfg.n_global_tokens < 0
            or cfg.dense_max_len < 0):
        raise ConfigError("n_segments, position_offset, n_random_blocks, n_global_tokens and dense_max_len "
                          "must be >= 0")
    _validate_heads(cfg)
    _validate_patterns(cfg)
    if cfg.n_decoder_layers is not None and cfg.architecture != "encoder-decoder":
        raise ConfigError(f"n_decoder_layers is only valid for architecture='encoder-decoder', "
                          f"not {cfg.architecture!r}")


def _validate_heads(cfg: ModelConfig) -> None:
    if cfg.d_head is None and cfg.d_model % cfg.n_heads:
        raise ConfigError(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads} "
                          f"(set d_head to decouple them)")
    if cfg.n_heads % cfg.kv_heads:
        raise ConfigError(f"n_heads={cfg.n_heads} is not divisible by n_kv_heads={cfg.kv_heads}")
    if cfg.position == "rotary":
        if cfg.rotary_width % 2:
            raise ConfigError(f"rotary_dim={cfg.rotary_width} must be even (pairs of dimensions rotate)")
        if cfg.rotary_width > cfg.head_dim:
            raise ConfigError(f"rotary_dim={cfg.rotary_width} exceeds the head width d_head={cfg.head_dim}")
        if cfg.rotary_theta <= 0:
            raise ConfigError(f"rotary_theta={cfg.rotary_theta} must be positive")
        _validate_rotary_scaling(cfg)
    if cfg.position == "xl-relative" and cfg.architecture != "encoder":
        raise ConfigError("position='xl-relative' (XLNet) is only implemented for architecture='encoder'")


def _validate_patterns(cfg: ModelConfig) -> None:
    schedule = cfg.layer_patterns()
    if len(schedule) != cfg.n_layers:
        raise ConfigError(f"attention_schedule has {len(schedule)} entries but n_layers={cfg.n_layers}")
    for pattern in schedule:
        if pattern not in PATTERNS:
            raise ConfigError(f"attention_schedule entry {pattern!r} is not one of {', '.join(PATTERNS)}")
        if pattern in BIDIRECTIONAL_ONLY and cfg.architecture == "decoder":
            raise ConfigError(f"attention={pattern!r} needs bidirectional attention; "
                              f"architecture='decoder' supports full, sliding-window, dilated")
    if cfg.share_layers and cfg.attention_schedule and len(set(schedule)) > 1:
        raise ConfigError("share_layers=True needs one attention pattern for every layer")
    windowed = {"sliding-window", "dilated", "longformer"} & set(schedule)
    _validate_windows(cfg)
    widest = max(cfg.window_schedule or [cfg.window])
    if windowed and widest > cfg.max_seq_len:
        raise ConfigError(f"window={widest} is larger than max_seq_len={cfg.max_seq_len}")
    if "bigbird" in schedule and cfg.block_size * 3 > cfg.max_seq_len:
        raise ConfigError(f"block_size={cfg.block_size} needs max_seq_len >= 3 blocks "
                          f"({3 * cfg.block_size}), got {cfg.max_seq_len}")
    if "linformer" in schedule and cfg.linformer_k > cfg.max_seq_len:
        raise ConfigError(f"linformer_k={cfg.linformer_k} exceeds max_seq_len={cfg.max_seq_len}")
    if "linformer" in schedule and cfg.position in ("relative-bias", "alibi", "xl-relative"):
        # projected keys no longer have positions for a (query, key) bias to refer to
        raise ConfigError(f"attention='linformer' cannot use position={cfg.position!r}; "
                          f"use learned, sinusoidal, rotary or none")
    if cfg.global_projections and "longformer" not in schedule:
        raise ConfigError("global_projections=True needs attention='longformer'")


def _validate_windows(cfg: ModelConfig) -> None:
    if cfg.window_schedule is None:
        return
    if cfg.architecture == "encoder-decoder":  # its decoder stack can be deeper than the schedule
        raise ConfigError("window_schedule is supported for architecture='encoder' and 'decoder' only")
    if len(cfg.window_schedule) != cfg.n_layers:
        raise ConfigError(f"window_schedule has {len(cfg.window_schedule)} entries but "
                          f"n_layers={cfg.n_layers}")
    for w in cfg.window_schedule:
        if not isinstance(w, int) or isinstance(w, bool) or w < 1:
            raise ConfigError(f"window_schedule entry {w!r} must be a positive integer")


def _validate_rotary_scaling(cfg: ModelConfig) -> None:
    _choice(cfg, "rotary_scaling", ROTARY_SCALINGS)
    _positive(cfg, "rotary_original_max_len")
    if cfg.rotary_scaling_factor <= 0:
        raise ConfigError(f"rotary_scaling_factor={cfg.rotary_scaling_factor} must be positive")
    if cfg.rotary_scaling == "llama3" and not 0 < cfg.rotary_low_freq_factor < cfg.rotary_high_freq_factor:
        raise ConfigError(f"rotary_low_freq_factor={cfg.rotary_low_freq_factor} and rotary_high_freq_factor="
                          f"{cfg.rotary_high_freq_factor} must satisfy 0 < low < high")
