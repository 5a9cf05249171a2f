"""Helpers every `lmforge` sub-command shares: usage errors, key=value overrides, config files."""
from __future__ import annotations

import argparse
import re
import sys
from contextlib import contextmanager
from pathlib import Path

import yaml

from lmforge.cli.flag_types import as_typed, bounded, integer
from lmforge.config import ModelConfig
from lmforge.config.options import MAX_SEED
from lmforge.config.names import close_names, unknown_among
from lmforge.io import load as load_model
from lmforge.presets import PRESETS, get_config
from lmforge.train.config import MAX_STEPS, TrainConfig, check_ranks
from lmforge.utils.apart import on_disk, refuse_writing_over
from lmforge.utils.atomic import blocking_parent, overlap
from lmforge.utils.yamltext import load_yaml


class UsageError(ValueError):
    """Bad command-line input; reported in one line with exit status 2."""

    def __init__(self, message: str = "", field: str | None = None) -> None:
        super().__init__(message)
        self.field = field  # the option refused, where one is: main names the --config file it came from


def note(line: str) -> None:
    """A long job's `log=`: its notes on standard error; standard output holds a command's results alone."""
    print(line, file=sys.stderr, flush=True)


SEED = (0, MAX_SEED)  # every seed's bound, said as the flag's
STEPS = (1, MAX_STEPS)  # TrainConfig's bound on steps, said as the flag's


def given_flags(args, *names: str) -> dict:
    """name -> value of the flags among `names` given on the command line (None: left out), to lay over the
    same options from --config and key=value: a flag wins."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def train_config(args, options: dict) -> TrainConfig:
    """The run's TrainConfig: the training `options` of --config and key=value under --steps and --seed (a
    flag wins) and check_ranks, the one merge every training command makes: they accept and refuse alike."""
    return check_ranks(TrainConfig.from_dict({**options, **given_flags(args, "steps", "seed")}))


MAX_CONFIG_BYTES = 1 << 20  # a --config file of key: value options; /dev/zero or a 100 MB file: refused


def with_bounds(parser: argparse.ArgumentParser) -> None:
    """Every flag of `parser` and its sub-commands says its default and bounds (`said`), as the flags made
    from an options object do; and each sub-command knows its whole name (args.prog: "lmforge index
    build"), for its errors to say as argparse's do."""
    for action in parser._actions:
        for sub in (action.choices or {}).values() if isinstance(action, argparse._SubParsersAction) else ():
            sub.set_defaults(prog=sub.prog)
            with_bounds(sub)
        if action.option_strings:
            said(action)


def said(action: argparse.Action, default=None, bounds: str = "") -> argparse.Action:
    """`action` with its default and bounds written into its help, the one way every flag says them:
    "what it is (default D; [low, high])". default: what a flag left out stands for, where argparse's is
    None to tell a flag not given; bounds: a text, where the flag's type (`bounded`) does not carry them.
    Said once (with_bounds passes over a flag said where it was added)."""
    if getattr(action, "said", False):
        return action
    if action.default is not None and action.default is not False and action.default != argparse.SUPPRESS:
        default = action.default
    low, high = getattr(action.type, "bounds", (None, None))
    bounds = bounds or ("" if low is None else f"[{low}, {high}]")
    parts = ([f"default {default}"] if default is not None and not action.required else []) + \
        ([bounds] if bounds and bounds not in (action.help or "") else [])
    joined = "; ".join(parts)  # bounds alone that are bracketed already, "(0, 1)", are not bracketed again
    action.help = " ".join(t for t in (action.help, joined if joined[:1] in "(" else f"({joined})") if t)
    action.said = True
    return action


def flag_error(err, values: dict, words: dict | None = None, flags: dict | None = None) -> UsageError:
    """An OptionsError from an options object built of flags, said as the command line says it:
    "--flag VALUE: rule" (a switch: "--switch: rule"), the rule in `words` (field -> text) or the check's own
    less the field's name; `flags`: a field whose flag is not --field-name."""
    field = str(err.field)
    flag = (flags or {}).get(field, "--" + field.replace("_", "-"))
    rule = (words or {}).get(field) or re.sub(rf"^{re.escape(field)}(=\S+)?:?\s*", "",
                                              str(err).split(", got ")[0])
    value = getattr(values.get(field), "text", values.get(field))  # as typed (TypedFloat): 1e400, not inf
    return UsageError(f"{flag}: {rule}" if isinstance(value, bool) else f"{flag} {value}: {rule}")


def named_once(err, flag: str, given=None) -> UsageError:
    """An OptionsError (or ValueError) about field `err.field` as a UsageError naming `flag` (and the value
    `given`) once: a message that opens with the field's own name ("layers '5': outside ...", "mix_gamma=2
    needs ...") has the flag in its place, not before it."""
    field, text = str(getattr(err, "field", "")), str(err)
    named = re.match(rf"{re.escape(field)}(=|\b)", text) if field else None
    if named:
        return UsageError(f"{flag}{' ' * (named[1] == '=')}{text[named.end():]}")
    return UsageError(f"{flag}{'' if given is None else f' {given}'}: {text}")


def option_flags(parser, cls, prefix: str = "", switches: dict | None = None, required: tuple = (),
                 words: dict | None = None, bound: bool = False) -> None:
    """A flag per field of the options dataclass `cls`, with the declaration's help, default, bounds and
    choices (the object checks the values: flag_values, then from_flags). A bool that defaults to False is
    its own switch; switches: field -> (flag, help) of a bool said as the opposite of its default True;
    required: fields whose flag must be given; prefix: of each dest, to keep a parent parser's flags apart
    from its sub-commands' flags of the same name; words: field -> {word: value}, the words a field's flag
    takes instead of its values (its default said as its word; flag_values reads them back); bound: an int
    field bounded both ways is read by `bounded`, so argparse tells a value out of them (1e18) the bounds."""
    from dataclasses import fields

    from lmforge.config.options import base_type

    defaults = cls()
    for f in fields(cls):
        flag, dest, default = "--" + f.name.replace("_", "-"), prefix + f.name, getattr(defaults, f.name)
        if f.name in (switches or {}):
            flag, text = switches[f.name]
            parser.add_argument(flag, dest=dest, action="store_true", help=text)
        elif base_type(f.type)[0] == "bool" and default is False:
            parser.add_argument(flag, dest=dest, action="store_true", default=None, help=f.metadata["help"])
        else:
            spec, shown, bounds = _value_flag(f, default, (words or {}).get(f.name), bound)
            said(parser.add_argument(flag, dest=dest, required=f.name in required, **spec), shown, bounds)


def _value_flag(f, default, words: dict | None, bound: bool) -> tuple:
    """A value-taking flag of option field `f`: its metavar, choices, type and help, then the default (or
    `unset`) and bounds `said` writes (words: the flag's {word: value}; bound: an int bounded both ways)."""
    from lmforge.config.options import base_type, bounds_text

    meta, kind = f.metadata, base_type(f.type)[0]
    if words:  # the default said as its word (truncate: "false", not False)
        default = next((word for word, value in words.items()
                        if value == default and type(value) is type(default)), default)
    choices = tuple(words) if words else meta["choices"]
    closed = None not in (meta["low"], meta["high"]) and not (meta["open_low"] or meta["open_high"])
    reads = {"int": as_typed(bounded(int, meta["low"], meta["high"]) if bound and closed else integer),
             "float": as_typed(float), "str": str}
    return ({"metavar": None if choices else f.name.upper(), "choices": choices,
             "type": str if words else reads[kind], "help": meta["help"]},
            meta.get("unset") if default is None else default, bounds_text(meta).strip())


def flag_values(args, cls, prefix: str = "", switches: dict | None = None, words: dict | None = None) -> dict:
    """field -> value of the option_flags of `cls` given on the command line (a switch: its field's value;
    a field with words: the value of its word)."""
    from dataclasses import fields

    given = {f.name: getattr(args, prefix + f.name, None) for f in fields(cls)}
    given = {name: value for name, value in given.items() if value is not None}
    given.update({name: words[name][given[name]] for name in (words or {}) if name in given})
    return {**given, **{name: not given[name] for name in (switches or {}) if name in given}}


def from_flags(build, flags: dict, given: dict | None = None, words: dict | None = None,
               names: dict | None = None, shown: dict | None = None):
    """build({**given, **flags}): an options object of flags (and `given` key=value options). A bad flag
    value is said as the command line says it (flag_error, with `words` and `names`; `shown`: values to
    print instead of the built ones); a bad key=value one keeps its own message, naming its key."""
    from lmforge.config.options import OptionsError

    try:
        return build({**(given or {}), **flags})
    except OptionsError as err:
        if str(err.field) in flags:
            raise flag_error(err, {**flags, **(shown or {})}, words, names) from None
        raise


def parse_overrides(pairs: list) -> dict:
    """`key=value` pairs; values are read as YAML scalars (1e-5, true, [a, b]); an empty key or value
    is an error (write key=null for none)."""
    overrides = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"expected key=value, got {pair!r}")
        if not value.strip():
            raise UsageError(f"{key.strip()}= has no value (write {key.strip()}=null for none)")
        overrides[key.strip()] = _scalar(value)
    return overrides


KEY_VALUE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*=")  # an override's start: a field name, then =


def _scalar(text: str):
    try:
        value = load_yaml(text)
    except yaml.YAMLError:  # not YAML ("[0.9", "@x"): the text as it is, for the option to judge
        return text
    if isinstance(value, str):  # nan, inf: a user writing lr=inf means the number (for the bounds to refuse)
        try:
            return float(value)
        except ValueError:
            return value
    return value


def read_config_file(path: str | None) -> dict:
    """Overrides from a YAML or JSON file (--config) of at most MAX_CONFIG_BYTES, read no further."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise UsageError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes")
        data = load_yaml(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        said = " ".join(str(err).split())  # a YAMLError's marks span lines: one line, as every error is
        raise UsageError(f"cannot read config file {path}: {said}") from None
    if not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a mapping of field: value")
    return data


def unknown_options(unknown, classes, extra=(), listed: str = "") -> UsageError:
    """The UsageError for key=value / --config keys `unknown` that are no field of a command's options
    `classes` nor one of `extra` (config.names.unknown_among's line); its .field the first of them, so main's
    config_source ends the line with "(from --config FILE)" where that key came from the file."""
    names = sorted(map(str, unknown))
    return UsageError(unknown_among(names, classes, extra, listed), names[0] if names else None)


def resolve_config(name: str, overrides: dict) -> ModelConfig:
    """A preset name, an lmforge model directory or a config JSON file, with overrides."""
    path = Path(name)
    if name in PRESETS:
        return get_config(name, **overrides)
    if path.is_dir():
        return load_model(path).config.with_overrides(**overrides)
    if path.is_file():
        return config_of_file(path, overrides)
    return get_config(name, **overrides)  # raises with the closest preset names


def config_of_file(path: Path, overrides: dict) -> ModelConfig:
    """The ModelConfig a JSON file holds, with overrides: its fields, or a model directory's config.json as
    lmforge writes it ({"format": "lmforge", "config": {...}}) or as Hugging Face does (its model_type)."""
    from lmforge.io import meta_config
    from lmforge.io.native import FORMAT, read_json_object

    data = read_json_object(path)
    if data.get("format") == FORMAT or "model_type" in data:  # as lmforge.load reads it, weights unread
        return meta_config(data, path.parent, path).with_overrides(**overrides)  # the file's faults name it
    return ModelConfig.from_overrides(data, overrides)  # the file's own inert values stand (converters')


def not_a_link(path: Path, kind: str | None, option: str) -> None:
    """A UsageError where the output `path` is a symbolic link that writing would go through: a link to a
    folder, or a dangling one, unless the output is a file (kind "file"), which replaces the link itself
    (atomic_write renames over it) and so never writes where the link points."""
    if path.is_symlink() and kind != "file" and (kind == "folder" or path.is_dir() or not path.exists()):
        raise UsageError(f"{option} {path}: is a symbolic link; outputs are never written through one "
                         "(name the folder it points to)")


def _check_out_path(path: Path, kind: str | None, option: str) -> None:
    """A UsageError where the output cannot be written: a folder's place taken by a file, a file's by a
    folder (kind "folder" or "file"; None: either), a file where one of its parent folders must be, or a
    symbolic link it would be written through."""
    not_a_link(path, kind, option)
    if kind == "folder" and path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: exists and is not a folder")
    if kind == "file" and path.is_dir():
        raise UsageError(f"{option} {path}: is a folder; name the file to write")
    if (blocked := blocking_parent(path)) is not None:
        raise UsageError(f"{option} {path}: {blocked}")


# the flags that name a model (or tokenizer) folder: read from its model files only (utils.atomic.MODEL_FILES)
MODEL_FOLDER_FLAGS = ("--model", "--tokenizer", "--teacher", "--retriever", "--generator")


def refuse_overwrite(out, *inputs, writes: tuple = (), option: str = "--out", kind: str | None = None,
                     sources: tuple = (), models: tuple = MODEL_FOLDER_FLAGS) -> None:
    """A UsageError where the output `out` cannot be written (empty; kind: "file" or "folder", a folder
    where `writes` are given; a link, a file above it); then utils.apart.refuse_writing_over, the one
    refusal Python's jobs raise too: UnsafePath naming `option` and the input where `out` would write over
    one of the inputs, (flag, path or paths or None) pairs (the flags `sources`: models the output may not
    hold at all; `models` the flags whose folder is read from its model files only, () where every input
    folder is read whole, a retrieval job's rule), before any work. UnsafePath is a ValueError: the command
    exits 2 with its line."""
    if out is None:
        return
    if not str(out).strip():  # Path("") is the working folder: a run would write itself into it
        raise UsageError(f"{option} is empty: name the output")
    _check_out_path(Path(out), "folder" if writes else kind, option)
    refuse_writing_over(out, *inputs, writes=writes, models=models, holds=sources, name=option)


def _on_disk(inputs) -> list:
    """(flag, path as given, resolved path) of each input on disk, of (flag, path or paths or None) pairs:
    a preset, "builtin", an empty name or a missing file is nothing on disk (utils.apart.on_disk's rule)."""
    return [(flag, source, Path(source).resolve()) for flag, given in inputs for source in on_disk(given)]


def refuse_nested(out, *inputs, option: str = "--out",
                  why: str = "a later run would read it as text") -> None:
    """A UsageError naming both flags where the output folder `out` lies inside an input folder or holds an
    input, of (flag, path or paths or None) pairs: `why` a later run would misread it. Before any read."""
    target = Path(out).resolve()
    for flag, source, src in _on_disk(inputs):
        if (relation := overlap(src, target)) == "lies inside":
            raise UsageError(f"{option} {out} lies inside the input folder {flag} {source}: {why}; choose an "
                             f"{option} outside it")
        if relation == "holds":
            raise UsageError(f"{flag} {source} lies inside {option} {out}: choose an {option} apart from "
                             f"the inputs")


def existing_model(flag: str, given: str, presets: tuple = ()) -> Path:
    """The model directory `given` names (a folder, or an installed model's); a UsageError naming `flag`
    where it names none, before the job that needs it runs; `presets`: the names `flag` takes besides
    (said, with the closest, where `given` is neither)."""
    from lmforge.io import find_model_dir

    try:
        return find_model_dir(given)
    except (ValueError, OSError) as err:
        close = close_names(given, presets, n=1)
        also = f"; or a preset: {', '.join(presets)}" + (f" (did you mean {close[0]}?)" if close else "")
        raise UsageError(f"{flag} {given}: {err}{also if presets else ''}") from None


@contextmanager
def flag_named(field: str, flag: str, given):
    """Inside it, a job's OptionsError about `field` (a check past the options objects', such as a DPR
    encoder's architecture) is a UsageError naming `flag` and its value `given`."""
    from lmforge.config.options import OptionsError

    try:
        yield
    except OptionsError as err:
        if err.field != field:
            raise
        raise named_once(err, flag, given) from None


def text_field(flag: str, files, hint: str, options=None) -> None:
    """A UsageError naming `flag`, the file and its records' fields where every one of `files` is a JSONL
    file whose records lack the text field (`options.text_field`): nothing would be read, which the reader
    said in two warnings and the job in an error repeating them; `hint`: how to name the field. The check is
    check_text_field's, Python's too."""
    from lmforge.config.options import OptionsError
    from lmforge.data.text_field import check_text_field

    try:
        check_text_field(files, options, hint)
    except OptionsError as err:
        raise UsageError(f"{flag} {err}") from None


def tokenizer_folder(flag: str, given: str | None) -> None:
    """A UsageError naming `flag` where `given` is no folder (a tokenizer's or a model's), said before the
    tokenizer's loader, whose "nope does not exist" names no flag."""
    if given is not None and not Path(given).is_dir():
        said = "is a file, not a folder" if Path(given).exists() else "no such folder"
        raise UsageError(f"{flag} {given}: {said} (give a tokenizer's folder, or a model's)")


def read_records(option: str, path, kind: str, columns, labelled: bool = True) -> list:
    """The (labelled) records of a task file given as `option`; an unreadable file is an error naming it."""
    from lmforge.tasks.formats import read_task_file

    try:
        return read_task_file(path, kind, columns, labelled)
    except OSError as err:
        raise UsageError(f"{option} {path}: {err.strerror or err}") from None


def check_task(task) -> None:
    """A UsageError naming --task where it is not a task kind."""
    from lmforge.tasks.base import MODULES

    if task is not None and task not in MODULES:
        raise UsageError(f"--task {task!r}: expected one of {', '.join(MODULES)}")
