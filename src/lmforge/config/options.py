"""Typed options: one dataclass per job holds each option's name, type, bounds, default and help.

A field is declared with `option(default, help, low=..., high=..., choices=...)`; `check_options`
enforces its declared type (a bool is not a number, "false" is not a bool, NaN is not a number),
its bounds both ways and its choices, and raises `OptionsError` naming the field. `from_dict`
builds an options object from a JSON / YAML / key=value mapping (unknown keys named), and
`coerce` turns a command-line string into the field's type. The command line, the Python API and
the server build the same object from these, so the three accept and refuse alike.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
from dataclasses import field
from typing import Any

from lmforge.config.names import listed_at, refuse_unknown  # noqa: F401 (re-exported)
from lmforge.utils.errors import OptionsError, checked_text, instance_of, shown  # noqa: F401 (re-exported)

# every seed a job, a call or a request takes (torch.Generator.manual_seed's int64 range): one bound for the
# command line's --seed, the Python API's seed= and the server's seed
MAX_SEED = 2 ** 63 - 1


@dataclasses.dataclass(frozen=True)
class Items:
    """A list option's items: their kind ("int" or "float"), how many (min_items to max_items: a list's
    cost is bounded, so max_items is required) and whether they must differ; the option's low/high bound
    each item."""

    kind: str
    max_items: int | None = None
    min_items: int = 0
    distinct: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("int", "float") or self.max_items is None:
            raise ValueError(f"Items({self.kind!r}): a list option's items are int or float, and max_items "
                             "is required")


def option(default, doc: str, *, low=None, high=None, open_low: bool = False, open_high: bool = False,
           choices: tuple | None = None, factory=None, items: Items | None = None, unset: str | None = None,
           max_entries: int | None = None):
    """A dataclass field with its default, one line of help and its bounds (listed by `lmforge options`).

    low/high: inclusive bounds of a number (open_low / open_high: that one excluded); None: no bound on that
    side (sizes always have an upper one). choices: the values a string may take. items: the field is a list
    of numbers (see Items), and low/high bound each one. unset: what a default of None stands for ("k", "16"),
    said as the default by a flag's help and `lmforge options`. max_entries: a dict's or plain list's size."""
    meta = {"help": doc, "low": low, "high": high, "open_low": open_low, "open_high": open_high,
            "choices": choices, "items": items, "unset": unset, "max_entries": max_entries}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


ITEM_NOUNS = {"int": "integers", "float": "numbers"}
BASE_TYPES = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
              "list": "a list", "dict": "a mapping", "tuple": "a list"}


def base_type(kind: str) -> tuple:
    """('int', optional?) from a field's annotation string ('Optional[int]' -> ('int', True))."""
    kind = str(kind).replace("typing.", "").strip()
    if kind.startswith("Optional[") and kind.endswith("]"):
        return kind[len("Optional["):-1], True
    if kind.endswith("| None"):
        return kind[:-len("| None")].strip(), True
    return kind, False


def members(kind: str) -> list:
    """The types a Union annotation admits ('Union[int, list]' or 'int | list' -> ['int', 'list'])."""
    kind = kind.strip()
    if kind.startswith("Union[") and kind.endswith("]"):
        kind = kind[len("Union["):-1].replace(",", "|")
    return [part.strip() for part in kind.split("|")] if "|" in kind and "[" not in kind else [kind]


def _is_instance(kind: str, value) -> bool:
    if len(members(kind)) > 1:
        return any(_is_instance(member, value) for member in members(kind))
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind in ("list", "tuple"):
        return isinstance(value, (list, tuple))
    if kind == "dict":
        return isinstance(value, dict)
    return True  # a type this checker does not know: the dataclass's own checks decide


def check_value(name: str, kind: str, meta: dict, value, error=OptionsError) -> None:
    """One field's value against its declared type, finiteness, bounds and choices."""
    base, optional = base_type(kind)
    if value is None:
        if optional:
            return
        raise error(f"{name} must be {BASE_TYPES.get(base, base)}, got null", name)
    if not _is_instance(base, value):
        wanted = " or ".join(BASE_TYPES.get(m, m) for m in members(base))
        # YAML reads no/yes/on/off as false/true: a word meant as text must be quoted there
        hint = " (a YAML file reads no, yes, on and off as false or true: quote the word)" if \
            isinstance(value, bool) and "str" in members(base) else ""
        raise error(f"{name} must be {wanted}, got {shown(value)}{hint}", name)
    if meta.get("items") and isinstance(value, (list, tuple)):
        return check_items(name, meta, value, error)
    if isinstance(value, (dict, list, tuple)) and len(value) > (meta.get("max_entries") or math.inf):
        raise error(f"{name} must hold at most {meta['max_entries']} entries, got {len(value)}", name)
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if base in ("int", "float") or (numeric and {"int", "float"} & set(members(base))):
        check_range(name, value, meta.get("low"), meta.get("high"), meta.get("open_low", False), error,
                    "an integer" if base == "int" else "a finite number", meta.get("open_high", False))
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise error(f"{name}={shown(value)} is not one of {', '.join(map(str, choices))}", name)


def check_items(name: str, meta: dict, value, error=OptionsError) -> None:
    """A list option's count, each item's type and bounds (reported as name[i]); if distinct, no repeats."""
    items = meta["items"]
    if not items.min_items <= len(value) <= items.max_items:
        raise error(f"{name} must hold {_count(items)} {ITEM_NOUNS[items.kind]}, got {len(value)}", name)
    bounds = {k: meta.get(k) for k in ("low", "high", "open_low", "open_high")}
    for i, item in enumerate(value):
        try:
            check_value(f"{name}[{i}]", items.kind, bounds, item, error)
        except error as bad:  # the message names the item, the field stays the option's
            raise error(str(bad), name) from None
    if items.distinct and len(set(value)) != len(value):
        raise error(f"{name} must not repeat a value, got {shown(list(value))}", name)


def _count(items: Items) -> str:
    """'2' or '0 to 16': how many items a list option holds."""
    low, high = items.min_items, items.max_items
    return str(low) if low == high else f"{low} to {high}"


def check_range(name: str, value, low, high, open_low: bool = False, error=OptionsError,
                noun: str = "a finite number", open_high: bool = False) -> None:
    """A finite number within [low, high] (open_low / open_high: that bound excluded; None: no bound)."""
    if value is None:
        return
    below = low is not None and (value <= low if open_low else value < low)
    above = high is not None and (value >= high if open_high else value > high)
    # bounds first, and an int past float's range (10**400) refused as not finite: isfinite overflowed on it
    if below or above or not _finite(value):
        bounds = " and ".join(([f"{'>' if open_low else '>='} {low}"] if low is not None else []) +
                              ([f"{'<' if open_high else '<='} {high}"] if high is not None else []))
        raise error(f"{name} must be {(noun + ' ' + bounds).strip()}, got {shown(value)}", name)


def _finite(value) -> bool:
    """A number within float's range (an unbounded field's 10**400 is no count or id any run could use)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_options(obj, error=OptionsError) -> None:
    """Every field of the options dataclass `obj` against its declaration (see `option`), a numpy number
    stored as Python's (plain_number) and a whole float as an int field's int, as `coerce` reads them, so
    that an object built directly (QueryOptions(k=3.0)) accepts what its .build and every face accept."""
    for f in dataclasses.fields(obj):
        value = plain_number(getattr(obj, f.name))
        if whole_kind(base_type(f.type)[0]):
            value = whole_number(value)
        if value is not getattr(obj, f.name):
            object.__setattr__(obj, f.name, value)  # a frozen object's too: it is being built
        check_value(f.name, f.type, f.metadata, value, error)


def checked_argument(name: str, kind: str, meta: dict, value, error=OptionsError):
    """A function's argument that is no options field (embed's batch_size, fill_mask's top_k), read as a
    field is: a numpy number as Python's (plain_number), then checked as `check_value` checks it; returned
    as read, so the tokenizers library and range() are given Python's numbers. A whole float (32.0) is read
    as the int it is where an int is wanted, as coerce reads a field's."""
    value = plain_number(value)
    if whole_kind(base_type(kind)[0]):
        value = whole_number(value)
    check_value(name, kind, meta, value, error)
    return value


def checked_seed(seed) -> int:
    """A seed given to a function (the built-in data's, lmforge.generate's), read and bounded as a run's
    seed field is (0 to MAX_SEED); an OptionsError naming seed."""
    return checked_argument("seed", "int", {"low": 0, "high": MAX_SEED}, seed)


def checked_as(cls, field: str, value, name: str | None = None, error=OptionsError):
    """`value` read and checked (checked_argument) as the options class `cls` declares its `field`, named
    `name` (default: the field): a function's argument bounded as another object's field is (evaluate's
    batch_size as TaskConfig's eval_batch_size, an index's seed as TrainConfig's)."""
    declared = cls.__dataclass_fields__[field]
    return checked_argument(name or field, declared.type, declared.metadata, value, error)


def whole_number(value):
    """A finite whole float (3.0) as the int it is; anything else (a fraction, a bool, text) as given, for the
    caller's check to judge: one reading for options fields (coerce), function arguments
    (checked_argument) and the server's int fields that are no options field."""
    return int(value) if type(value) is float and math.isfinite(value) and value.is_integer() else value


def int_text(text: str) -> int:
    """An integer's text as coerce reads it: exactly however long, a whole number's too ("3.0", "1e3"); a
    ValueError otherwise (a fraction, NaN, an infinity, a word): a command line's count flag reads it so."""
    try:
        return int(text)
    except ValueError:
        value = whole_number(float(text))
    if not isinstance(value, int):
        raise ValueError(text)
    return value


def refuse_changed(obj, names, why) -> None:
    """An OptionsError naming the first of `names` set in the options dataclass `obj` to other than its
    declared default, "name=value: why" (why: text, or a function of the name): a setting the run would not
    read is refused, never ignored (its default changes nothing, so it passes)."""
    defaults = {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
                for f in dataclasses.fields(obj) if f.name in names}
    for name in names:
        value = getattr(obj, name)
        if value != defaults[name]:
            raise OptionsError(f"{name}={value!r}: {why(name) if callable(why) else why}", name)


def plain_number(value):
    """A numpy (or other numbers-registered) integer or real scalar as the Python int or float of the same
    value, as the command line's text of it reads (np.int64(3) was refused as not an integer, np.float32(0.9)
    as not a number, where np.float64, a float subclass, passed); a list's or tuple's items alike (as a
    list); anything else, bools included, as given."""
    if isinstance(value, (list, tuple)):
        return [plain_number(item) for item in value] if any(_foreign(item) for item in value) else value
    if not _foreign(value):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _foreign(value) -> bool:
    """A number that is not Python's own int or float (nor a bool)."""
    return isinstance(value, numbers.Real) and type(value) not in (int, float, bool)


def coerce(cls, name: str, value: Any, error=OptionsError, from_text: bool = True):
    """A value for field `name` of `cls` as its type: a numpy scalar as Python's number (plain_number); a
    whole float (3.0) as an int; from_text (a command line's key=value): also "true"/"false" as a bool,
    "null" as None and a numeric string as a number. Anything else is returned as given, for
    `check_options` to judge (a JSON "false" is not a bool)."""
    kinds = {f.name: f.type for f in dataclasses.fields(cls)}
    base, optional = base_type(kinds[name])
    value = plain_number(value)
    if isinstance(value, str) and from_text:
        text = value.strip()
        if optional and text.lower() in ("null", "none", "~"):
            return None
        if base == "bool" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if base in ("int", "float"):
            try:
                value = float(text)
            except ValueError:
                raise error(f"{name} must be {BASE_TYPES[base]}, got {shown(value)}", name) from None
        elif _numeric_union(base):  # "2" for an `int | list` field is the number; other text is the check's
            try:
                value = float(text)
            except ValueError:
                pass
    if base == "int" and isinstance(value, float):
        value = whole_number(float(value))
        if isinstance(value, float):
            raise error(f"{name} must be a whole number, got {shown(value)}", name)
    elif whole_kind(base) and isinstance(value, float):
        value = whole_number(value)  # a fraction is left for the check: it names each type the union admits
    return value


def whole_kind(kind: str) -> bool:
    """Whether a field of this base type reads a whole float (3.0) as its int: an int field, or a union that
    admits an int and no float (eos_token_id's int | list, student_layers' int | str)."""
    kinds = set(members(kind))
    return "int" in kinds and "float" not in kinds


def _numeric_union(kind: str) -> bool:
    """A union admitting a number and no text: a command line's "2" can only mean the number."""
    kinds = set(members(kind))
    return len(kinds) > 1 and bool(kinds & {"int", "float"}) and "str" not in kinds


def from_dict(cls, data: dict, what: str = "", error=OptionsError, from_text: bool = False):
    """The options dataclass `cls` from a mapping; an unknown key is an error naming it (config.names).
    from_text: the values are a command line's strings (see `coerce`)."""
    if not isinstance(data, dict):
        raise error(f"{what or cls.__name__} options must be a mapping, got {shown(data)}", "options")
    refuse_unknown(data, [f.name for f in dataclasses.fields(cls)], what, error, listed_at(cls))
    return cls(**{k: coerce(cls, k, v, error, from_text) for k, v in data.items()})


def named_keywords(what: str):
    """A decorator: a keyword the function does not take is an OptionsError naming it and those it takes,
    as an options object's unknown field is (`from_dict`; embed and generate, whose options are **fields),
    where Python's TypeError was no OptionsError; the signature stays the function's own."""
    def decorate(func):
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        known = sorted(p.name for p in inspect.signature(func).parameters.values() if p.kind in kinds)

        @functools.wraps(func)
        def checked(*args, **keywords):
            refuse_unknown(keywords, known, what, listed=f"help({func.__module__}.{func.__qualname__})")
            return func(*args, **keywords)
        return checked
    return decorate


def with_changes(cls, options, fields: dict | None, what: str, from_text: bool = False,
                 drop_none: bool = False):
    """`options` (an instance of `cls`, or None for its defaults) with `fields` changed, checked again
    (drop_none: a field given as None keeps its value, for keyword arguments that default to None)."""
    instance_of(options, cls, "options")  # a dict of its fields is refused, not read as one
    base = {} if options is None else {f.name: getattr(options, f.name) for f in dataclasses.fields(cls)}
    changes = {k: v for k, v in (fields or {}).items() if not (drop_none and v is None)}
    return from_dict(cls, {**base, **changes}, what, from_text=from_text)


def help_rows(cls) -> list:
    """(name, default, help with its bounds) of each option of `cls`."""
    rows = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        default = f.metadata.get("unset") or default if default is None else default
        rows.append((f.name, default, f.metadata.get("help", "") + bounds_text(f.metadata)))
    return rows


def bounds_text(meta: dict) -> str:
    """' [low, high]' (or ' (low, high]') for a bounded option, ' (2 to 16, each in [low, high])' (its count,
    then each item's bounds) for a list of numbers, ' (at most N entries)' for a sized dict or list, ''."""
    if meta.get("max_entries") is not None:
        return f" (at most {meta['max_entries']} entries)"
    low, high = meta.get("low"), meta.get("high")
    opening, closing = "(" if meta.get("open_low") else "[", ")" if meta.get("open_high") else "]"
    interval = f"{opening}{'' if low is None else low}, {'' if high is None else high}{closing}"
    items = meta.get("items")
    if items:
        return f" ({_count(items)}{', distinct' if items.distinct else ''}, each in {interval})"
    return "" if low is None and high is None else f" {interval}"


def checked_texts(texts, name: str = "texts", one: bool = True) -> list:
    """`texts` (a text or any iterable of texts: a list, a tuple, a generator, a dataset's column) as a
    list of str, at least one; anything else an OptionsError naming `name` (one=False: a single text is
    refused too): an empty request is refused here as the server (422) and the command line (exit 2) do."""
    if isinstance(texts, str) and one:
        return [texts]
    if isinstance(texts, (set, frozenset)):  # its order is arbitrary: the results would match no text
        raise OptionsError(f"{name} must be {'a text or ' if one else ''}a list of texts, got "
                           f"{type(texts).__name__} (unordered: the results could not be matched to the "
                           "texts)", name)
    if isinstance(texts, (str, bytes, bytearray, dict)) or not hasattr(texts, "__iter__"):
        raise OptionsError(f"{name} must be {'a text or ' if one else ''}a list of texts, got "
                           f"{type(texts).__name__}", name)
    texts = list(texts)
    if not texts:
        raise OptionsError(f"{name} must be {'a text or ' if one else ''}a non-empty list of texts", name)
    for i, text in enumerate(texts):
        checked_text(text, name, f"{name}[{i}]", "text")
    return texts


def checked_progress(progress):
    """`progress` as given: None or a function of the texts done; anything else an OptionsError naming
    progress, before any work (progress=3 failed as "'int' object is not callable" after the first batch)."""
    if progress is not None and not callable(progress):
        raise OptionsError(f"progress must be a function of the texts done, got {type(progress).__name__}",
                           "progress")
    return progress
