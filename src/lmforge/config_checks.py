"""ModelConfig's rules that read a few fields each (config.py calls them): the error type,
choices, positive sizes, windows, rotary scaling and pruned heads. No import of config.py, which
imports this."""
from __future__ import annotations

# position schemes with a term per head: a pruned layer would need its own slice of them
PER_HEAD_POSITIONS = ("relative-bias", "alibi", "xl-relative")


class ConfigError(ValueError):
    """An invalid ModelConfig field; the message names the field and the valid choices."""


def choice(cfg, name: str, choices: tuple) -> None:
    """The field `name` holds one of `choices`."""
    value = getattr(cfg, name)
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(choices)}")


def positive(cfg, *names: str) -> None:
    """Each field in `names` is a positive integer (or None)."""
    for name in names:
        value = getattr(cfg, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{name}={value!r} must be a positive integer")


def validate_windows(cfg) -> None:
    """A window_schedule has a positive window per layer of an encoder or a decoder."""
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


def validate_rotary_scaling(cfg, scalings: tuple) -> None:
    """The rotary scaling is one of `scalings` with factors that make sense."""
    choice(cfg, "rotary_scaling", scalings)
    positive(cfg, "rotary_original_max_len")
    if cfg.rotary_scaling_factor <= 0:
        raise ConfigError(f"rotary_scaling_factor={cfg.rotary_scaling_factor} must be positive")
    if cfg.rotary_scaling == "llama3" and not 0 < cfg.rotary_low_freq_factor < cfg.rotary_high_freq_factor:
        raise ConfigError(f"rotary_low_freq_factor={cfg.rotary_low_freq_factor} and rotary_high_freq_factor="
                          f"{cfg.rotary_high_freq_factor} must satisfy 0 < low < high")


def validate_pruned(cfg) -> None:
    """pruned_heads names attentions the architecture has, layers it has, and leaves each a head."""
    if not cfg.pruned_heads:
        return
    if cfg.share_layers or cfg.kv_heads != cfg.n_heads or cfg.position in PER_HEAD_POSITIONS:
        raise ConfigError("pruned_heads needs separate layers, n_kv_heads = n_heads and no per-head position "
                          f"terms (not {', '.join(PER_HEAD_POSITIONS)}); mask those heads instead")
    stacks = {"encoder": cfg.n_layers, "decoder": cfg.decoder_layers, "cross": cfg.decoder_layers}
    if cfg.architecture != "encoder-decoder":
        stacks = {cfg.architecture: cfg.n_layers}
    for key, heads in cfg.pruned_heads.items():
        attention, _, layer = str(key).partition(".")
        if attention not in stacks or not layer.isdigit() or int(layer) >= stacks[attention]:
            raise ConfigError(f"pruned_heads key {key!r} is not one of {sorted(stacks)} '.' a layer index")
        if (not isinstance(heads, list) or len(set(heads)) != len(heads)
                or not all(isinstance(h, int) and 0 <= h < cfg.n_heads for h in heads)):
            raise ConfigError(f"pruned_heads[{key!r}] must list distinct heads in 0..{cfg.n_heads - 1}")
        if len(heads) >= cfg.n_heads:
            raise ConfigError(f"pruned_heads[{key!r}] removes every head of the layer: keep at least one")
