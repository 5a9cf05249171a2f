"""FeatureOptions: one request for contextual features, shared by `lmforge.features`, `lmforge features`
and the server's POST /features, so the three accept and refuse alike.

layers: which hidden states (0 = the embedding output, n = the top layer; a negative index counts from
the top, so -1 is the last layer and -2 BERT's second-to-last, bert-as-service's default), as an int, a
list, a text "0,3,6", a range "4-8", "all", or "mix": every state mixed by ELMo's scalar mix,
gamma * sum_j softmax(s)_j h_j (Peters et al. 2018, eq. 1) with s = mix_weights (equal by default).
A state named twice ("0,0,0", "0-3,2", -1 beside the top layer's index) is refused, naming it.
pooling: a text's tokens kept ("none", each with its text and character offsets) or reduced, as
bert-as-service's strategies: mean, max, mean_max (the two concatenated), cls (the first token: [CLS], <s>;
T5's first piece, ELMo's first word), sep / last (the last real token: [SEP], </s>; ELMo's last word).
Word inputs (`lmforge features --data`) pool a word's pieces: first, mean, last.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise
from typing import Optional, Union

from lmforge.config.model import MAX_LAYERS, MAX_LEN
from lmforge.config.options import Items, OptionsError, check_options, option, whole_number, with_changes

TEXT_POOLINGS = ("none", "mean", "max", "mean_max", "cls", "sep", "last")
WORD_POOLINGS = ("first", "mean", "last")
POOLINGS = TEXT_POOLINGS + ("first",)
MAX_SPEC_CHARS = 4096  # characters of a layer selection text
MAX_WEIGHT = 100.0  # |s_j| and |gamma|: softmax saturates long before
# ASCII digits only, as attention's layer_list reads them (a str's \d took "２" and "١" as 2 and 1)
_INDEX = re.compile(r"-?\d{1,7}", re.ASCII)
_RANGE = re.compile(r"(\d{1,7})-(\d{1,7})", re.ASCII)
_WHOLE = re.compile(r"(-?\d{1,7})\.0+", re.ASCII)  # "2.0": a command line's text of layers=2.0


@dataclass
class FeatureOptions:
    """Which hidden states, mixed or not, pooled how, and the length a text may have."""

    layers: Union[int, str, list] = option("all", "hidden states: an index (0 = embeddings, -1 = the top "
                                           "layer), a list, 0,3,6, a range 4-8, all, or mix (the scalar mix)")
    mix_weights: Optional[list] = option(None, "layers=mix: the scalar mix's weights s_j, one per "
                                         "hidden state (softmax-normalised); default equal",
                                         low=-MAX_WEIGHT, high=MAX_WEIGHT,
                                         items=Items("float", MAX_LAYERS + 1, min_items=1))
    mix_gamma: Optional[float] = option(None, "layers=mix: the scalar mix's scale gamma",
                                        low=-MAX_WEIGHT, high=MAX_WEIGHT, unset="1")
    pooling: str = option("none", "none (per token, with its text and offsets), mean, max, mean_max, cls, "
                          "sep or last; word inputs: first, mean or last", choices=POOLINGS)
    max_length: Optional[int] = option(None, "tokens per text, at most the model's limit and room for one "
                                       "beside its special tokens (3 for BERT; default: the model's limit)",
                                       low=2, high=MAX_LEN)
    truncate: bool = option(False, "cut a text longer than max_length instead of refusing it")

    def __post_init__(self) -> None:
        check_options(self)
        self.layers = _checked_spec(self.layers)
        if self.mix_weights is not None and self.layers != "mix":
            raise OptionsError("mix_weights needs layers=mix", "mix_weights")
        if self.mix_gamma is not None and self.layers != "mix":  # given, it would be ignored
            raise OptionsError(f"mix_gamma={self.mix_gamma} needs layers=mix", "mix_gamma")

    @classmethod
    def build(cls, options: Optional["FeatureOptions"] = None, fields: Optional[dict] = None,
              from_text: bool = False) -> "FeatureOptions":
        """`options` (or the defaults) with `fields` changed; an unknown name or a bad value names the
        field."""
        return with_changes(cls, options, fields, "features", from_text, drop_none=True)

    @property
    def mixed(self) -> bool:
        """Whether the chosen states are mixed into one."""
        return self.layers == "mix"

    def chosen(self, n_states: int) -> list:
        """The hidden-state indices (0 .. n_states - 1, sorted) the options select from a model with
        n_states states; a layer the model lacks names the field."""
        return resolve_layers(self.layers, n_states)

    def mix(self, n_states: int) -> tuple:
        """(softmax weights (n_states,), gamma) of the scalar mix; a weight count that is not n_states names
        mix_weights."""
        import torch

        weights = [0.0] * n_states if self.mix_weights is None else list(self.mix_weights)
        if len(weights) != n_states:
            raise OptionsError(f"mix_weights has {len(weights)} weights; this model has {n_states} hidden "
                               f"states (embeddings + {n_states - 1} layers)", "mix_weights")
        gamma = 1.0 if self.mix_gamma is None else float(self.mix_gamma)
        return torch.softmax(torch.tensor(weights, dtype=torch.float64), 0), gamma


def _checked_spec(spec):
    """The layer selection as given, refused (naming layers) where it cannot be read; a list stays a list."""
    if isinstance(spec, bool):
        raise OptionsError(f"layers must be an index, a list of indices or a text, got {spec!r}", "layers")
    if isinstance(spec, int):
        _index(str(spec))
        return spec
    if isinstance(spec, (list, tuple)):
        spec = [whole_number(i) for i in spec]  # [0, 2.0] is [0, 2], as layers=2.0 is layer 2
        if not 0 < len(spec) <= MAX_LAYERS or not all(isinstance(i, int) and not isinstance(i, bool)
                                                      for i in spec):
            raise OptionsError(f"layers must be a list of 1 to {MAX_LAYERS} integers, got {str(spec)[:60]}",
                               "layers")
        for i in spec:
            _index(str(i))
        _once(spec, [(i, i) for i in spec])
        return list(spec)
    text = str(spec).strip()
    if len(text) > MAX_SPEC_CHARS:
        raise OptionsError(f"layers has {len(text)} characters, more than {MAX_SPEC_CHARS}", "layers")
    if text in ("all", "mix"):
        return text
    if _WHOLE.fullmatch(text):  # the whole number's text, read as the number is (a count flag's "3.0" too)
        return _checked_spec(int(_WHOLE.fullmatch(text)[1]))
    _once(text, _parts(text))
    return text


def _once(spec, pairs: list, n_states: int | None = None) -> None:
    """Refuse a selection naming a hidden state twice ("0,0,0", "0-3,2", or "-1" beside the top layer's
    index): one state answered where the client counted several is a mistake, not a request."""
    spans = sorted((first, last) for first, last in pairs if first <= last)  # reversed: refused by range
    for (_, last), (first, _) in pairwise(spans):
        if first <= last:  # sorted, so an overlap is the next span starting inside this one
            top = "" if n_states is None else f" (here -1 is layer {n_states - 1})"
            raise OptionsError(f"layers {str(spec)[:60]!r} names layer {first} twice{top}; "
                               f"name each hidden state once", "layers")


def _index(part: str) -> int:
    if not _INDEX.fullmatch(part):
        raise OptionsError(f"layers: {part[:20]!r} is not a layer index (0 = embeddings, -1 = the top layer)",
                           "layers")
    return int(part)


def _parts(text: str) -> list:
    """[(first, last)] of a text selection, each bound an int (a range's ends non-negative)."""
    parts = [p.strip() for p in text.split(",")]
    if not all(parts) or len(parts) > MAX_LAYERS:
        raise OptionsError(f"layers {text[:60]!r}: expected an index, a range like 4-8, a list like 0,3,6 "
                           f"(negative: from the top), all or mix", "layers")
    out = []
    for part in parts:
        found = _RANGE.fullmatch(part)
        out.append((int(found[1]), int(found[2])) if found else (_index(part),) * 2)
    return out


def resolve_layers(spec, n_states: int) -> list:
    """Sorted hidden-state indices of a selection (see FeatureOptions.layers) in a model of n_states."""
    spec = _checked_spec(spec)
    if spec in ("all", "mix"):
        return list(range(n_states))
    pairs = [(spec, spec)] if isinstance(spec, int) else [(i, i) for i in spec] if isinstance(spec, list) \
        else _parts(spec)
    chosen = []
    for first, last in pairs:
        first, last = (i + n_states if i < 0 else i for i in (first, last))
        if not (0 <= first < n_states and 0 <= last < n_states) or last < first:
            raise OptionsError(f"layers {str(spec)[:60]!r}: outside 0..{n_states - 1} (0 is the embeddings, "
                               f"-1 the top layer)", "layers")
        chosen.append((first, last))
    _once(spec, chosen, n_states)  # "-1,12" of 13 states: only the model tells the two apart
    return sorted(i for first, last in chosen for i in range(first, last + 1))

