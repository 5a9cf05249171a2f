"""ModelConfig: one flat, typed, validated description of any Transformer LM.

Every architectural axis of DESIGN.md is one field here; its value selects a
small module through a module-level dict in `lmforge.layers`. Invalid values
raise `ConfigError` with a one-line message naming the field and the choices.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

from lmforge.config.checks import (MAX_WIDTH, ConfigError, inert_fields, layout_inert, refuse_inert,
                                   validate_elmo, validate_ffn_sizes, validate_patterns, validate_pruned,
                                   validate_quantization, validate_rotary_scaling)
from lmforge.config.names import listed_at, refuse_unknown
from lmforge.config.options import check_options, coerce, option
from lmforge.utils import jsontext
from lmforge.utils.atomic import atomic_write_text

ARCHITECTURES = ("encoder", "decoder", "encoder-decoder", "elmo")  # elmo: a biLSTM LM (lmforge/elmo.py)
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


# Peters et al. 2018 (Jozefowicz et al. 2016's CNN-BIG-LSTM bank): 2048 filters of widths 1-7
ELMO_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))


# upper bounds of the sizes: far above any published model (BLOOM's 250,880 tokens, 12,288 widths,
# 128 layers), far below a count that alone exhausts memory; `fits` then checks the model's bytes
MAX_VOCAB, MAX_FF, MAX_LAYERS, MAX_HEADS, MAX_LEN = 2**22, 2**18, 1024, 1024, 2**20

SPECIAL_TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
                  "forced_bos_token_id", "forced_eos_token_id")


@dataclass
class ModelConfig:
    """All hyper-parameters of one model, named as in the papers (Vaswani et al. 2017 onwards)."""

    architecture: str = option("encoder", "encoder (BERT), decoder (GPT), encoder-decoder (T5, BART) "
                                                "or elmo (a biLSTM LM)", choices=ARCHITECTURES)
    vocab_size: int = option(30522, "rows of the token embedding table (token ids 0 .. vocab_size-1)",
                             low=1, high=MAX_VOCAB)
    d_model: int = option(768, "hidden width of every layer (the residual stream)", low=1, high=MAX_WIDTH)
    n_layers: int = option(12, "blocks in the stack (the encoder's, for an encoder-decoder)",
                           low=1, high=MAX_LAYERS)
    n_heads: int = option(12, "attention (query) heads per layer", low=1, high=MAX_HEADS)
    n_kv_heads: Optional[int] = option(None, "key/value heads: null = n_heads (MHA); 1: MQA; else GQA",
                                       low=1, high=MAX_HEADS)
    d_head: Optional[int] = option(None, "width of one head; null: d_model // n_heads", low=1, high=MAX_WIDTH)
    d_ff: int = option(3072, "inner width of the feed-forward sub-layer", low=1, high=MAX_FF)
    n_decoder_layers: Optional[int] = option(None, "encoder-decoder only: decoder blocks; null: n_layers",
                                             low=1, high=MAX_LAYERS)
    max_seq_len: int = option(512, "longest sequence (positions) the model takes", low=1, high=MAX_LEN)
    dropout: float = option(0.1, "dropout on embeddings and sub-layer outputs", low=0, high=1,
                                    open_high=True)
    attention_dropout: float = option(0.1, "dropout on attention probabilities", low=0, high=1,
                                              open_high=True)
    # embeddings
    d_embed: Optional[int] = option(None, "factorised embedding size E (ALBERT, ELECTRA); null: d_model",
                                    low=1, high=MAX_WIDTH)
    n_segments: int = option(2, "token-type (segment) embeddings; 0 for none", low=0, high=MAX_HEADS)
    position: str = option("learned", f"position scheme: {' | '.join(POSITIONS)}", choices=POSITIONS)
    position_offset: int = option(0, "first learned position id (RoBERTa and BART start at 2)",
                                  low=0, high=MAX_LEN)
    position_from_padding: bool = option(False, "RoBERTa: a token's position counts the real tokens before "
                                         "it in attention_mask; padding takes row position_offset - 1")
    scale_embeddings: bool = option(False, "multiply token embeddings by sqrt(d_model)")
    embedding_norm: bool = option(True, "BERT's LayerNorm after the embedding sum")
    tie_embeddings: bool = option(True, "the LM head reuses the token embedding matrix")
    # position-scheme parameters
    rotary_theta: float = option(10000.0, "rotary: base of the rotation frequencies",
                                 low=0, high=1e12, open_low=True)
    rotary_dim: Optional[int] = option(None, "rotary: leading head dimensions rotated; null: d_head",
                                       low=1, high=MAX_WIDTH)
    rotary_scaling: str = option("none", "rotary: none, linear (all frequencies / factor), llama3",
                                 choices=ROTARY_SCALINGS)
    rotary_scaling_factor: float = option(1.0, "rotary: the context-extension factor of the scaling",
                                          low=0, high=1e6, open_low=True)
    rotary_low_freq_factor: float = option(1.0, "llama3: wavelengths > original/low are divided by it",
                                           low=0, high=1e6, open_low=True)
    rotary_high_freq_factor: float = option(4.0, "llama3: wavelengths < original/high are kept",
                                            low=0, high=1e6, open_low=True)
    rotary_original_max_len: int = option(8192, "llama3: the context the base frequencies were trained on",
                                          low=1, high=MAX_LEN)
    relative_buckets: int = option(32, "relative-bias (T5): number of distance buckets", low=1, high=MAX_LEN)
    relative_max_distance: int = option(128, "relative-bias (T5): distance of the last bucket",
                                        low=1, high=MAX_LEN)
    # normalisation
    norm: str = option("layernorm", "layernorm or rmsnorm", choices=NORMS)
    norm_placement: str = option("post", "post (BERT: after the residual add) or pre (GPT-2: before)",
                                 choices=PLACEMENTS)
    norm_eps: float = option(1e-12, "epsilon inside every norm", low=0, high=1, open_low=True)
    norm_bias: bool = option(True, "norms have a bias (a shift)")
    final_norm: Optional[bool] = option(None, "a norm after the last block; null: true for pre-norm")
    # sub-layers
    ffn: str = option("gelu", f"feed-forward activation: {' | '.join(FFNS)}", choices=FFNS)
    ffn_bias: bool = option(True, "feed-forward linear layers have biases")
    attention_bias: bool = option(True, "q, k, v and output projections have biases")
    attention_scaling: bool = option(True, "divide scores by sqrt(d_head) (T5 folds it into its init)")
    # attention pattern
    attention: str = option("full", f"attention pattern: {' | '.join(PATTERNS)}", choices=PATTERNS)
    attention_schedule: Optional[list] = option(None, "per-layer pattern names; null: `attention` in all")
    window: int = option(512, "window width: |i-j| <= window//2 (bidirectional), i-window < j <= i (causal)",
                         low=1, high=MAX_LEN)
    window_schedule: Optional[list] = option(None, "per-layer windows (Longformer sec. 3.1); null: `window`")
    dilation: int = option(1, "dilated pattern: attend to every dilation-th key of the window",
                           low=1, high=MAX_LEN)
    n_global_tokens: int = option(1, "longformer: leading global tokens when none are given ([CLS])",
                                  low=0, high=MAX_LEN)
    global_projections: bool = option(False, "longformer: separate q/k/v projections for global attention")
    block_size: int = option(64, "bigbird: tokens per block", low=1, high=MAX_LEN)
    n_random_blocks: int = option(3, "bigbird: random blocks each query block attends to",
                                  low=0, high=MAX_HEADS)
    # BigBird: "seeded" draws the random blocks per layer; "first" puts every draw on the first block,
    # which then counts 1 + n_random_blocks times (the reference library's inference-time layout)
    random_block_choice: str = option("seeded", "bigbird: seeded (random blocks per layer) or first",
                                      choices=RANDOM_BLOCK_CHOICES)
    dense_max_len: int = option(0, "bigbird: sequences of at most this many tokens attend fully; 0: never",
                                low=0, high=MAX_LEN)
    linformer_k: int = option(256, "linformer: projected length of keys and values", low=1, high=MAX_LEN)
    # parameter economy
    share_layers: bool = option(False, "one block's weights for every layer (ALBERT cross-layer sharing)")
    # heads removed by physical pruning (Michel et al. 2019; lmforge/compress/head_pruning.py)
    pruned_heads: Optional[dict] = option(None, "heads removed per attention and layer, by original index: "
                                                "{'encoder.3': [0, 5], 'cross.1': [2]}; null: none")
    ffn_sizes: Optional[dict] = option(None, "hidden units kept per layer by FFN pruning: "
                                             "{'encoder.3': 1536}; null: d_ff everywhere")
    quantization: Optional[dict] = option(None, "int8 Linears (compress/quantize.py): {'mode': 'dynamic' | "
                                                "'weight-only', ...}; null: fp32")
    # LM head (heads.py reads these so a preset describes its family's head)
    lm_transform: bool = option(True, "LM head: BERT's dense + activation + norm before the projection")
    lm_bias: bool = option(True, "LM head: a bias on the vocabulary projection")
    tied_logit_scale: bool = option(False, "LM head: states x d_model**-0.5 before the projection, tied or "
                                    "not (T5's scale_decoder_outputs)")
    lm_activation: Optional[str] = option(None, "LM head transform's activation: "
                                          f"{' | '.join(LM_ACTIVATIONS)}; null: ffn's",
                                          choices=LM_ACTIVATIONS)
    pooler_activation: str = option("tanh", "of the pooled [CLS] dense layer: "
                                    f"{' | '.join(POOLER_ACTIVATIONS)} (DistilBERT relu, ELECTRA gelu)",
                                    choices=POOLER_ACTIVATIONS)
    # ELECTRA (objectives/rtd.py): a pretraining option read from the discriminator's config, of no
    # effect on this model's architecture (canonical() ignores it)
    generator_size: Optional[float] = option(None, "ELECTRA: the generator's d_model, d_ff and n_heads as "
                                                   "a fraction of this model's; null: 1/4",
                                                   low=0, high=1, open_low=True)
    # special token ids (generation, padding); no effect on the architecture
    pad_token_id: Optional[int] = option(None, "id of the padding token", low=0, high=MAX_VOCAB)
    bos_token_id: Optional[int] = option(None, "id of the beginning-of-sequence token", low=0, high=MAX_VOCAB)
    eos_token_id: Optional[int] = option(None, "id of the end-of-sequence token (generation stops there)",
                                         low=0, high=MAX_VOCAB)
    decoder_start_token_id: Optional[int] = option(None, "encoder-decoders: the first decoder input",
                                                   low=0, high=MAX_VOCAB)
    forced_bos_token_id: Optional[int] = option(None, "generation: the first new token (mBART's language id)",
                                                low=0, high=MAX_VOCAB)
    forced_eos_token_id: Optional[int] = option(None, "generation: the token at the maximum length (BART)",
                                                low=0, high=MAX_VOCAB)
    # ELMo (architecture="elmo", Peters et al. 2018): vocab_size is the softmax's word vocabulary, d_model the
    # LSTM projection (and token representation) width, n_layers the LSTM layers of each direction
    char_embed_dim: int = option(16, "elmo: width of the character embeddings", low=1, high=MAX_WIDTH)
    char_filters: Optional[list] = option(None, "elmo: the character CNN's [width, n_filters] pairs; null: "
                                                "the original's 2048 filters of widths 1-7")
    n_highway: int = option(2, "elmo: highway layers after the character CNN", low=0, high=MAX_HEADS)
    lstm_dim: int = option(4096, "elmo: LSTM memory cell width (projected to d_model: LSTMP)",
                           low=1, high=MAX_FF)
    cell_clip: Optional[float] = option(3.0, "elmo: memory cells clipped to +-cell_clip; null: no clip",
                                        low=0, high=1e6, open_low=True)
    proj_clip: Optional[float] = option(3.0, "elmo: projected states clipped to +-proj_clip; null: no clip",
                                        low=0, high=1e6, open_low=True)
    n_characters: int = option(262, "elmo: character ids (UTF-8 bytes, 4 marks, padding; 0 pads words)",
                               low=1, high=MAX_VOCAB)
    max_characters_per_token: int = option(50, "elmo: characters per word, marks included (longer ones cut)",
                                           low=1, high=MAX_HEADS)
    skip_connections: bool = option(True, "elmo: residual connection around every LSTM layer but the first")
    stateful: bool = option(False, "elmo: carry each row's LSTM state into the next batch (the original's "
                                   "training); false: every batch starts from zeros (deterministic)")
    source: str = option("", "where a preset's numbers come from")

    def __post_init__(self) -> None:
        if isinstance(self.attention_schedule, tuple):
            self.attention_schedule = list(self.attention_schedule)
        if isinstance(self.window_schedule, tuple):
            self.window_schedule = list(self.window_schedule)
        if isinstance(self.pruned_heads, dict):  # tuples from Python, lists from JSON: one form
            self.pruned_heads = {k: list(v) if isinstance(v, tuple) else v
                                 for k, v in self.pruned_heads.items()}
        if isinstance(self.char_filters, (list, tuple)):  # tuples from Python, lists from JSON: one form
            self.char_filters = [list(f) if isinstance(f, (list, tuple)) else f for f in self.char_filters]
        check_options(self, ConfigError)  # types (a bool is true or false, not "false"), bounds both ways
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

    def layer_d_ff(self, stack: str, layer: int) -> int:
        """Feed-forward hidden units of a stack's ("encoder" or "decoder") layer, after pruning."""
        return (self.ffn_sizes or {}).get(f"{stack}.{layer}", self.d_ff)

    def layer_heads(self, attention: str, layer: int) -> int:
        """Heads of one attention ("encoder", "decoder" or "cross") at `layer`, after pruning."""
        return self.n_heads - len((self.pruned_heads or {}).get(f"{attention}.{layer}", ()))

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

    @property
    def cnn_filters(self) -> list:
        """ELMo's character CNN filters as [width, n_filters] pairs (char_filters, or the original's)."""
        return self.char_filters or [list(f) for f in ELMO_FILTERS]

    def layer_patterns(self) -> list:
        """Attention pattern of each layer (the schedule, or `attention` everywhere)."""
        return list(self.attention_schedule or [self.attention] * self.n_layers)

    def layer_window(self, layer: int) -> int:
        """Window width of one layer (the window schedule, or `window`)."""
        return self.window_schedule[layer] if self.window_schedule else self.window

    def inert_fields(self) -> dict:
        """Field -> what would give it an effect, for every field of no effect on this model."""
        return inert_fields(self)

    def canonical(self) -> "ModelConfig":
        """A copy with every field that has no effect here (but checks.kept_inert's) reset to its default
        (and no source), so two configs of the same architecture compare equal."""
        unset = [name for name in ("pruned_heads", "ffn_sizes") if not getattr(self, name)]  # {}: none either
        # layout_inert, not inert_fields: kept_inert's fields stay as given, as the identity of runs
        # (train/loop.py) recorded them; n_heads' default would divide few of an ELMo's d_model
        inert = {"source", "generator_size", *SPECIAL_TOKENS, *unset, *layout_inert(self)}
        # the LM head's activation anyway; or no transform, which on a tied encoder is taken (ELECTRA's
        # generator reads it) but reset here as before, for the identities runs recorded
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
        if not isinstance(data, dict):  # the whole config is at fault: config.json's name for it
            raise ConfigError("config: a model config must be a mapping of fields, got "
                              f"{type(data).__name__}", "config")
        refuse_unknown(data, [f.name for f in fields(cls)], "config", ConfigError, listed_at(cls), "field")
        return cls(**{k: coerce(cls, k, v, ConfigError, from_text=False) for k, v in data.items()})

    def replace(self, **overrides: Any) -> "ModelConfig":
        """A validated copy with some fields changed."""
        return self.from_dict({**self.to_dict(), **overrides})

    def with_overrides(self, **overrides: Any) -> "ModelConfig":
        """replace() for fields a user asked for: a ConfigError where one has no effect on the result."""
        return self.from_overrides(self.to_dict(), overrides)

    @classmethod
    def from_overrides(cls, data: dict, overrides: dict) -> "ModelConfig":
        """from_dict of `data` with the `overrides` a user asked for over it, validated as one: a ConfigError
        where an override has no effect on the result. The one place an inert override is refused."""
        for name, given in (("config", data), ("overrides", overrides)):  # ** would raise a bare TypeError
            if not isinstance(given, dict):
                raise ConfigError(f"{name}: must be a mapping of model config fields, got "
                                  f"{type(given).__name__}", name)
        cfg = cls.from_dict({**data, **overrides})
        # only the overrides: data's own fields of no effect stand (a converter's config.json holds some)
        refuse_inert(cfg, overrides)  # else lstm_dim=64 on a BERT, window=64 on dense attention, do nothing
        return cfg

    def save(self, path: str | os.PathLike) -> None:
        """Write as JSON, atomically."""
        atomic_write_text(Path(path), json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ModelConfig":
        """Read a JSON file written by `save`; a ConfigError naming the file where it cannot be read, is not
        JSON or holds no valid config (its field the config's at fault, else the file's)."""
        try:
            data = jsontext.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:  # ValueError: not UTF-8, not JSON
            raise ConfigError(f"{path}: cannot read a model config: {getattr(err, 'strerror', None) or err}",
                              str(path)) from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a model config must be a mapping of fields, got "
                              f"{type(data).__name__}", str(path))
        try:
            return cls.from_dict(data)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}", err.field) from None


def _validate(cfg: ModelConfig) -> None:
    """The rules across fields (check_options has checked each field's type, bounds and choices)."""
    if cfg.position_from_padding and cfg.position == "learned" and cfg.position_offset < 1:
        raise ConfigError("position_from_padding needs position_offset >= 1: padding takes row "
                          "position_offset - 1", "position_from_padding")
    for name in SPECIAL_TOKENS:
        token = getattr(cfg, name)
        if token is not None and token >= cfg.vocab_size:
            raise ConfigError(f"{name}={token} is outside the vocabulary [0, {cfg.vocab_size})", name)
    if cfg.architecture != "elmo":  # a biLSTM has no heads: n_heads need not divide its d_model (nor be set)
        _validate_heads(cfg)
    validate_pruned(cfg)
    validate_ffn_sizes(cfg)
    validate_quantization(cfg)
    if cfg.architecture == "elmo":
        validate_elmo(cfg)
    validate_patterns(cfg, PATTERNS, BIDIRECTIONAL_ONLY)
    if cfg.n_decoder_layers is not None and cfg.architecture != "encoder-decoder":
        raise ConfigError(f"n_decoder_layers is only valid for architecture='encoder-decoder', "
                          f"not {cfg.architecture!r}", "n_decoder_layers")


def _validate_heads(cfg: ModelConfig) -> None:
    if cfg.d_head is None and cfg.d_model % cfg.n_heads:
        raise ConfigError(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads} "
                          f"(set d_head to decouple them)", "n_heads")
    if cfg.n_heads % cfg.kv_heads:
        raise ConfigError(f"n_heads={cfg.n_heads} is not divisible by n_kv_heads={cfg.kv_heads}",
                          "n_kv_heads")
    if cfg.position == "rotary":
        if cfg.rotary_width % 2:
            raise ConfigError(f"rotary_dim={cfg.rotary_width} must be even (pairs of dimensions rotate)",
                              "rotary_dim")
        if cfg.rotary_width > cfg.head_dim:
            raise ConfigError(f"rotary_dim={cfg.rotary_width} exceeds the head width d_head={cfg.head_dim}",
                              "rotary_dim")
        validate_rotary_scaling(cfg)
    if cfg.position == "xl-relative" and cfg.architecture != "encoder":
        raise ConfigError("position='xl-relative' (XLNet) is only implemented for architecture='encoder'",
                          "position")
