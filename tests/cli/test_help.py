"""`lmforge COMMAND --help`: every command has a summary, and every flag a line saying what it is, then its
default and bounds the one way (cli/common.said): "what it is (default D; [low, high])"."""
import argparse
import re

from lmforge.cli import build_parser


def _parsers(parser):
    """(parser, its sub-command's summary) of `parser` and every sub-command under it, however deep."""
    yield parser, parser.description
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                for inner, summary in _parsers(sub):
                    yield inner, summaries.get(name) if inner is sub else summary


def _flags():
    """(command, flag) of every optional argument but -h/--help, in every sub-parser."""
    for parser, _ in _parsers(build_parser()):
        for action in parser._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                yield parser.prog, action


def _bare(text: str) -> str:
    """The help less its bracketed parts (bounds, defaults): what is left says what the flag is."""
    while True:
        shorter = re.sub(r"[\[(][^\[\]()]*[\])]", "", text)
        if shorter == text:
            return text.strip()
        text = shorter


def test_every_flag_says_what_it_is_and_its_default_the_one_way():
    flags = list(_flags())
    assert len(flags) > 250  # every command's
    for prog, action in flags:
        name = f"{prog} {action.option_strings[0]}"
        assert action.help and re.search("[a-z]{2}", _bare(action.help)), (name, action.help)
        default = action.default
        if default is not None and default is not False and default != argparse.SUPPRESS:
            assert action.help.count(f"default {default}") == 1, (name, action.help)  # said once
        low, high = getattr(action.type, "bounds", (None, None))
        if low is not None:
            assert action.help.endswith(f"[{low}, {high}])"), (name, action.help)  # closing the help


def test_every_command_has_a_summary():
    for parser, summary in _parsers(build_parser()):
        assert summary and summary.strip(), parser.prog


def test_embed_s_model_help_names_every_kind_of_folder_it_reads():
    embed = next(action for prog, action in _flags() if prog == "lmforge embed" and "--model" in
                 action.option_strings)
    for kind in ("sentence-transformers", "Hugging Face", "lmforge", "all-MiniLM-L6-v2"):
        assert kind in embed.help, kind  # lmforge's own folders were left out, which it reads as well


def test_corpus_inputs_help_names_every_compression_read():
    """data/openers.py reads gzip, bzip2 and xz alike; the help of each command reading corpora says so."""
    parsers = {parser.prog: parser for parser, _ in _parsers(build_parser())}
    for prog, dest in [("lmforge corpus shard", "files"), ("lmforge pretrain", "data"),
                       ("lmforge tokenizer train", "files")]:
        text = next(a.help for a in parsers[prog]._actions if a.dest == dest)
        assert all(kind in text for kind in ("gzip", "bzip2", "xz")), (prog, text)
