"""The `lmforge` command: one sub-command per job, a module per job in this package.

Exit status 0 on success, 2 on bad usage or bad input (a one-line message, no
traceback), 1 on an internal error.
"""
from __future__ import annotations

import argparse
import os
import re
import select
import sys
import warnings
from pathlib import Path

from lmforge.cli import (analysis, analysis_probe, bakeoff, data, distill, generate, model, options, pretrain,
                         prune, quantize, retrieve, serve, tasks, tokenizer)
from lmforge.cli.common import KEY_VALUE, UsageError, with_bounds
from lmforge.config import ConfigError
from lmforge.config.names import close_names
from lmforge.io import CheckpointError
from lmforge.utils.model_folder import inside_job_folder
from lmforge.utils.ranks import one_process

# each adds its sub-commands
JOBS = (model, pretrain, tokenizer, data, tasks, generate, analysis, analysis_probe, prune, distill, quantize,
        retrieve, bakeoff, serve, options)


# the jobs that run under torchrun with several processes: their Trainer joins the process group (parallel=
# ddp|fsdp all-reduce the gradients) and rank 0 alone writes; any other job refuses (utils.ranks.one_process)
SEVERAL_RANKS = ("lmforge pretrain", "lmforge finetune")


# the arguments that name a file, folder, model or preset: "" is none of them; read as one it is the
# working folder (Path("") is ".": --out "" wrote a run into it), or a test that takes it as the flag left
# out (--valid "", --tokenizer "", --calibration "": a run without them, exit 0)
PATHS = {"--add-tokens", "--calibration", "--config", "--data", "--dev", "--file", "--importance-data",
         "--index", "--model", "--out", "--passages", "--plan", "--png", "--preset", "--questions",
         "--reader", "--rerank", "--retriever", "--student", "--svg", "--teacher", "--test", "--tokenizer",
         "--train", "--valid", "src", "dst", "files", "model"}


def overrides_last(parser, args: list | None) -> list | None:
    """`args` with every key=value override moved behind the flags (after "--"), so that a sub-command's
    `overrides` positional takes them wherever they stand (`steps=3 --out x` as `--out x steps=3`, not as a
    file of `--data a.txt steps=3`), with a positional before them (inspect NAME --config F d=1: d=1 was
    unrecognized). A one-value flag's value (`--out a=b`) stays; args with their own "--" are as given."""
    *lead, last = [a for a in parser._actions if not a.option_strings] or [None]
    takes = {flag: a.nargs for a in parser._actions for flag in a.option_strings}
    if args is None or "--" in args or getattr(last, "dest", None) != "overrides" or lead and (
            any(a.nargs is not None for a in lead) or any(n in ("*", "+") for n in takes.values())):
        return args
    kept, moved, skip = [], [], 0
    for arg in args:
        if skip:
            kept.append(arg)
            skip -= 1
        elif KEY_VALUE.match(arg) or lead and not arg.startswith("-"):
            moved.append(arg)
        else:
            kept.append(arg)
            nargs = takes.get(arg, 0)
            skip = 1 if nargs in (None, "?") else nargs if isinstance(nargs, int) else 0
    return [*kept, "--", *moved] if moved else kept


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (argparse's own print the usage block first)."""

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, with a sub-command's key=value overrides taken wherever they stand among its flags."""
        return super().parse_known_args(overrides_last(self, args), namespace)

    def parse_args(self, args=None, namespace=None):
        """argparse's, with an unknown flag refused by the sub-command that was given it (its name, its
        --help, a flag of its own it is close to), not by `lmforge`, whose help lists no job's flags."""
        args = sys.argv[1:] if args is None else list(args)
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            prog = getattr(parsed, "prog", self.prog)
            owner = next((p for p in parser_chain(self, prog) if p.prog == prog), self)
            named = prog.split()[-1]  # the sub-command's own word: a flag before it is lmforge's
            if named in args and extras[0] in args and args.index(extras[0]) < args.index(named):
                owner = self
            owner.error(f"unrecognized arguments: {' '.join(extras)}{close_flag(owner, extras)}")
        return parsed

    def error(self, message: str):
        """Exit with status 2 after one line naming the command, the error and where help is."""
        message = missing_command(self, message)
        self.exit(2, f"{self.prog}: error: {one_line(as_flag_value(message))} (see {self.prog} --help)\n")


def missing_command(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's "the following arguments are required: action" for a missing sub-command (its dest, a
    word no help shows) said as "give a command: train, ..."; any other message as it is."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and \
                message == f"the following arguments are required: {action.dest}":
            return f"give a command: {', '.join(action.choices)}"
    return message


# argparse's refusals of a flag's value, said as the options objects' are ("--flag VALUE: rule"): the
# rule's text, then the value given
FLAG_VALUE = (
    (re.compile(r"^argument (?P<flag>\S+): (?P<rule>.*?), got '?(?P<value>.*?)'?$"), "{rule}"),
    (re.compile(r"^argument (?P<flag>\S+): invalid (?P<kind>int|float) value: '(?P<value>.*)'$"), "{kind}"),
    (re.compile(r"^argument (?P<flag>\S+): invalid choice: '(?P<value>.*?)' \(choose from (?P<rule>.*)\)$"),
     "not one of {rule}"),
)
KINDS = {"int": "must be an integer", "float": "must be a number"}


def as_flag_value(message: str) -> str:
    """argparse's "argument --flag: rule, got VALUE" as "--flag VALUE: rule"; other messages as they are."""
    for pattern, said in FLAG_VALUE:
        found = pattern.match(message)
        if found:
            parts = found.groupdict()
            rule = said.format(rule=parts.get("rule", "").replace("'", ""),
                               kind=KINDS.get(parts.get("kind"), ""))
            if not parts["flag"].startswith("-"):  # a sub-command's name: "job: no such command (...)"
                return f"{parts['value']}: no such {parts['flag']} ({rule.removeprefix('not ')})"
            return f"{parts['flag']} {parts['value']}: {rule}"
    return message


def one_line(message) -> str:
    """A message on one line: line breaks and runs of spaces (a YAML parser's report) made one space."""
    return " ".join(str(message).split())


def close_flag(parser: argparse.ArgumentParser, extras: list) -> str:
    """"; did you mean --model?" for the first unknown flag among `extras` that is close to one of
    `parser`'s flags (--modle), or that is the reference library's name of one (config.names.REFERENCE, read
    as option names: --max-length is max_length); "" where none is."""
    flags = {flag[2:].replace("-", "_"): flag for a in parser._actions for flag in a.option_strings
             if flag.startswith("--")}
    for given in (e.split("=")[0] for e in extras if e.startswith("--")):
        close = close_names(given[2:].replace("-", "_"), flags, n=1)
        if close:
            return f"; did you mean {flags[close[0]]}?"
    return ""


def parser_chain(parser: argparse.ArgumentParser, prog: str) -> list:
    """The parsers from `parser` down to the sub-command whose whole name is `prog` (index, index build)."""
    chain, todo = [], [parser]
    while todo:
        sub = todo.pop()
        if f"{prog} ".startswith(f"{sub.prog} "):
            chain.append(sub)
            todo += [p for a in sub._actions if isinstance(a, argparse._SubParsersAction)
                     for p in a.choices.values()]
    return chain


def empty_path(parser: argparse.ArgumentParser, args) -> str | None:
    """The first argument of PATHS that the command line `args` (of `parser`) gave as an empty or blank text,
    as a flag or its metavar (SRC); None where there is none."""
    chain = parser_chain(parser, args.prog)
    for action in (a for sub in chain for a in sub._actions):
        name = action.option_strings[0] if action.option_strings else action.dest
        value = getattr(args, action.dest, None) if name in PATHS else None
        if any(isinstance(v, str) and not v.strip() for v in (value if isinstance(value, list) else [value])):
            return name if action.option_strings else (action.metavar or name.upper())
    return None


# the arguments that name a model to read, which a job's run folder stands for (its final/: io/resolve.py)
MODEL_ARGS = {"--model", "--teacher", "--retriever", "--generator", "--reader", "src", "model"}


def run_folder_notes(parser: argparse.ArgumentParser, args) -> list:
    """A line for each model argument that names a run folder (no config.json of its own, a final/ that
    has one), which the loaders read as its final/ (utils/model_folder.py): the folder read, and its best/
    (the best validation score's model, which docs/*.md evaluate) where there is one."""
    notes = []
    for action in (a for sub in parser_chain(parser, args.prog) for a in sub._actions):
        name = action.option_strings[0] if action.option_strings else action.dest
        value = getattr(args, action.dest, None) if name in MODEL_ARGS else None
        if not isinstance(value, str) or not value.strip():
            continue
        folder = Path(value)
        if inside_job_folder(folder) != folder / "final":  # the loaders' one rule (model/ is read first)
            continue
        best = folder / "best"
        also = f"; {best} holds the best validation score's model: name it to read that one" \
            if (best / "config.json").is_file() else ""
        notes.append(f"{args.prog}: note: {name} {value} is a run folder: reading {folder / 'final'} "
                     f"(its last step's model){also}")
    return notes


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    from lmforge import __version__

    parser = OneLineParser(prog="lmforge", description="The `lmforge` command: one sub-command per job. "
                          "`lmforge JOB --help` lists a job's flags and `lmforge options` the key=value "
                          "options; the guides are docs/*.md, from docs/index.md.")
    parser.add_argument("--version", action="version", version=f"lmforge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for job in JOBS:
        job.add_parsers(sub)
    with_bounds(parser)
    return parser


def _reader_gone() -> bool:
    """Whether stdout is a pipe its reader has closed; if so it is pointed at /dev/null, so that the
    interpreter's flush at exit does not report the same broken pipe again."""
    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        gone = any(events & select.POLLERR for _, events in poll.poll(0))  # a pipe with no reader
    except (AttributeError, OSError, ValueError):  # no file behind it (a caller's StringIO)
        return False
    if gone:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    return gone


def _warning_line(command: str):
    """warnings.showwarning for a command (its whole name): lmforge's own warnings (data, truncation ...) as
    one line each, "lmforge COMMAND: warning: ...", as its errors are; others (torch's ...) as Python shows
    them."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if category.__module__.startswith("lmforge."):
            print(f"{command}: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)
    return show


def config_source(args, err) -> str:
    """" (from --config FILE)" where the refused field's value came from the --config file (given there, and
    not as key=value, which wins over it), so the line names the file to mend; "" otherwise."""
    field, path = getattr(err, "field", None), getattr(args, "config", None)
    overrides = getattr(args, "overrides", None) or []
    if not field or not path or any(str(o).startswith(f"{field}=") for o in overrides):
        return ""
    from lmforge.cli.common import read_config_file

    try:
        return f" (from --config {path})" if str(field).split(".")[0] in read_config_file(path) else ""
    except UsageError:
        return ""


def main(argv: list | None = None) -> int:
    """Entry point of the `lmforge` command."""
    try:  # Ctrl-C while the parser is built (its imports take a moment) ends quietly too
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        return 130
    try:
        with warnings.catch_warnings():
            if argv is None:  # the command itself; a caller's main([...]) keeps its warnings as it has them
                warnings.showwarning = _warning_line(args.prog)
            if args.prog not in SEVERAL_RANKS:  # before any file is looked at
                one_process(args.prog.removeprefix("lmforge "), UsageError)
            said = empty_path(parser, args)
            if said is not None:
                raise UsageError(f"{said} is empty: name a file, folder or model (\"\" would be read as the "
                                 f"working folder, or as {said} not given)")
            for note in run_folder_notes(parser, args):
                print(note, file=sys.stderr)
            args.func(args)
        sys.stdout.flush()  # a reader gone before the last buffered line breaks here, not at exit
    except BrokenPipeError as err:
        if not _reader_gone():  # another pipe (a socket, a subprocess): an error like any other
            print(f"{args.prog}: error: {one_line(err)}", file=sys.stderr)
            return 2
        return 141  # `lmforge ... | head`: the reader has what it wanted; 128 + SIGPIPE, as a shell says
    except (UsageError, ConfigError, CheckpointError, ValueError, OSError) as err:
        print(f"{args.prog}: error: {one_line(err)}{config_source(args, err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
