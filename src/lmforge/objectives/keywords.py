"""An objective's own keyword arguments (its rates, loss weights, temperature): what a caller may set.

One check for every face that passes an objective options beyond its name's: `lmforge pretrain`'s
objective_options (train.pretrain_options) and a bake-off arm's `options` (bakeoff.plan_reads). A
keyword the objective's build does not take, a value not of its default's kind, or one out of the
range the objective states (Objective.check_values) is refused naming the field, before any model,
corpus or tokenizer is built.
"""
from __future__ import annotations

import inspect
import math

from lmforge.config.names import unknown_message
from lmforge.objectives.mlm import MaskedLM
from lmforge.objectives.registry import ObjectiveSpec
from lmforge.utils.errors import OptionsError, shown

# what builds give themselves, from the tokenizer
FROM_TOKENIZER = {"pad_id", "special_ids", "bos_id", "eos_id", "ends", "sentence_end"}


def init_defaults(cls: type) -> dict:
    """The defaults of `cls.__init__`, under them those of the masked LM it passes `**mlm` on to: a
    subclass's base class, ELECTRA's generator's MaskedLM; less those the class fixes itself (its `fixed`:
    SpanBERT's whole_word, which a caller's would clash with)."""
    params = inspect.signature(cls.__init__).parameters
    own = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
    if "mlm" not in params or params["mlm"].kind is not inspect.Parameter.VAR_KEYWORD:
        return own
    to = MaskedLM
    if issubclass(cls, MaskedLM):
        to = next(base for base in cls.__mro__[1:] if "__init__" in vars(base))
    return {k: v for k, v in {**init_defaults(to), **own}.items() if k not in getattr(cls, "fixed", ())}


def objective_options(spec: ObjectiveSpec, options: dict) -> dict:
    """The keyword arguments the objective is built with: its __init__ defaults, the name's, the caller's."""
    cls = getattr(spec.build, "__self__", None)
    return {**(init_defaults(cls) if isinstance(cls, type) else {}), **spec.options, **options}


def objective_keywords(spec: ObjectiveSpec) -> set:
    """The keyword arguments `spec`'s objective may be built with: its build's own, or where the build
    passes **options on, the class's (and the masked LM's it passes on) less those the build gives from
    the tokenizer."""
    parameters = inspect.signature(spec.build).parameters.values()
    if all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in parameters):
        return {p.name for p in parameters if p.default is not inspect.Parameter.empty}
    return set(objective_options(spec, {})) - FROM_TOKENIZER


def option_kind(value, default) -> str | None:
    """What an objective option whose default is `default` must be, where `value` is not that (a finite
    number, an integer, true or false, text, or a list of them for a tuple); None where it is, or where the
    default (None) says nothing."""
    if isinstance(default, tuple):
        listed = isinstance(value, (list, tuple))
        kinds = {option_kind(v, default[0]) for v in value} if listed and default else {None}
        return None if listed and kinds == {None} else f"a list like {list(default)}"
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(default, (int, float)):
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if isinstance(default, int):
            return None if number and isinstance(value, int) else "an integer"
        return None if number else "a finite number"
    if isinstance(default, str):
        return None if isinstance(value, str) else "text"
    return None


def check_keywords(spec: ObjectiveSpec, options: dict, where: str) -> None:
    """An OptionsError naming `where`.KEY for the first of `options` that `spec`'s objective does not take,
    is not of its default's kind, or is out of the range the objective states (its check_values)."""
    known = objective_keywords(spec)
    unknown = sorted(set(options) - known)
    if unknown:
        raise OptionsError(f"{where}.{unknown[0]}: {unknown_message(unknown, known, f'{spec.name} option')}",
                           f"{where}.{unknown[0]}")
    defaults = objective_options(spec, {})
    cls = getattr(spec.build, "__self__", None)
    for key in sorted(options):  # of its default's kind, or the FLOP count and the build fail inside
        said = option_kind(options[key], defaults.get(key))
        if said is not None:
            raise OptionsError(f"{where}.{key}: must be {said}, got {shown(options[key])}", f"{where}.{key}")
        try:
            getattr(cls, "check_values", lambda _: None)({key: options[key]})
        except ValueError as err:
            raise OptionsError(f"{where}.{key}: {err}", f"{where}.{key}") from None
