"""The objectives `lmforge pretrain` knows, by name: each objective file registers its own.

An `ObjectiveSpec` is one name as data: the callable that builds the objective around a model
and a tokenizer (the class's `build`), the options that name passes it (wwm is MaskedLM with
whole_word=True, sop is PairMLM with task="sop"), the architectures it trains, the family of
the tokenizer trained for it when none is given, and the format of its examples
(lmforge.data.stream.ExampleFormat). `check` refuses a model the objective cannot train (its
architecture, a required field, segment ids its examples use, its own `fits` tests) before any work,
for pretrain and the bake-off's plan check alike. The recipe (train/pretrain.py), the command line and the
data layer read these facts; none of them tests an objective's name.

The registry fills as the objective files are imported; `import lmforge.objectives` imports
every file of the package, so ask through it (as pretrain and the CLI do) to see them all.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lmforge.config import ARCHITECTURES
from lmforge.data.stream import ExampleFormat
from lmforge.utils.errors import OptionsError

# the subword model each tokenizer family's original uses (lmforge.tokenizer.train's families)
TOKENIZER_KINDS = {"bert": "wordpiece", "roberta": "bytelevel-bpe", "gpt2": "bytelevel-bpe", "t5": "unigram",
                   "words": "wordlevel"}  # words: whole words, ELMo's softmax vocabulary (tokenizer/chars.py)


@dataclass(frozen=True, kw_only=True)
class ObjectiveSpec:
    """One objective name: how it is built, what it trains, the tokenizer and examples it wants."""

    name: str
    build: Callable  # (model, tokenizer, **options) -> Objective; a teacher objective gets the teacher
    architectures: tuple  # of config.ARCHITECTURES
    tokenizer: str  # a key of TOKENIZER_KINDS
    examples: ExampleFormat
    summary: str = ""  # a few words for --help: what the paper calls it
    aliases: tuple = ()
    options: dict = field(default_factory=dict)  # keyword arguments of `build` that this name fixes
    requires: dict = field(default_factory=dict)  # config fields the objective needs (XLNet's position)
    teacher: bool = False  # distils a teacher model: pretrain builds the objective around the teacher
    # further tests of a config, each (cfg) -> None where it fits, else (the field as set, why it does not)
    fits: tuple = ()

    def __post_init__(self) -> None:
        if not self.architectures or set(self.architectures) - set(ARCHITECTURES):
            raise ValueError(f"objective {self.name!r}: architectures {self.architectures} must be some of "
                             f"{', '.join(ARCHITECTURES)}")
        if self.tokenizer not in TOKENIZER_KINDS:
            raise ValueError(f"objective {self.name!r}: tokenizer family {self.tokenizer!r} is not one of "
                             f"{', '.join(TOKENIZER_KINDS)}")

    def check(self, cfg, preset: str = "") -> None:
        """Raise OptionsError (field `objective`), one line saying why, unless this objective trains a
        model of config `cfg` (from `preset`)."""
        if cfg.architecture not in self.architectures:
            article = "an" if cfg.architecture[0] in "aeiou" else "a"  # an encoder, a decoder, an elmo
            self._refuse(f"{article} {cfg.architecture} ({preset})",
                         f"it trains {' or '.join(self.architectures)} models")
        for key, value in self.requires.items():
            if getattr(cfg, key) != value:
                self._refuse(f"{key}={getattr(cfg, key)!r} ({preset})", f"it needs {key}={value!r}")
        if self.examples.kind == "pairs" and cfg.n_segments == 1:  # a one-row table cannot embed id 1
            self._refuse(f"n_segments=1 ({preset})", "its sentence pairs take segment ids 0, 1, so it "
                         "needs a model with 2 segment types (n_segments=2, or 0: no segment embedding)")
        for test in self.fits:
            why = test(cfg)
            if why:
                self._refuse(f"{why[0]} ({preset})", why[1])

    def _refuse(self, what: str, why: str) -> None:
        raise OptionsError(f"objective {self.name!r} does not fit {what}: {why}", "objective")

    def make(self, model, tokenizer):
        """The objective around `model` (a teacher objective's: the teacher), with this name's options."""
        return self.build(model, tokenizer, **self.options)


_SPECS: dict = {}  # name -> spec, in registration order (the order --help lists)
_ALIASES: dict = {}  # alias -> name


def register(spec: ObjectiveSpec) -> ObjectiveSpec:
    """Add `spec` under its name and aliases (replacing a spec of the same name); returns it."""
    for key in (spec.name, *spec.aliases):
        owner = _ALIASES.get(key, key if key in _SPECS else None)
        if owner is not None and owner != spec.name:
            raise ValueError(f"objective name {key!r} is taken by {owner!r}")
    unregister(spec.name)
    _SPECS[spec.name] = spec
    _ALIASES.update({alias: spec.name for alias in spec.aliases})
    return spec


def unregister(name: str) -> None:
    """Remove objective `name` and its aliases (nothing if it is not registered)."""
    spec = _SPECS.pop(name, None)
    for alias in spec.aliases if spec else ():
        _ALIASES.pop(alias, None)


def get(name: str) -> ObjectiveSpec:
    """The spec of objective `name` or of an alias; ValueError, one line listing the choices, otherwise."""
    spec = _SPECS.get(_ALIASES.get(name, name))
    if spec is None:
        aliases = ", ".join(f"{a}={n}" for a, n in _ALIASES.items())
        raise ValueError(f"unknown objective {name!r}: choose one of {', '.join(_SPECS)} "
                         f"(aliases: {aliases})")
    return spec


def names() -> tuple:
    """The registered objective names (not aliases), in registration order."""
    return tuple(_SPECS)


def aliases() -> dict:
    """Every alias and the name it stands for."""
    return dict(_ALIASES)


def specs() -> tuple:
    """Every registered ObjectiveSpec, in registration order."""
    return tuple(_SPECS.values())
