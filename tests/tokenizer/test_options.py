"""TokenizerOptions: each bound refused both ways naming its field, a setting the kind would ignore
refused where it is given (not where it is the default), and the command line refusing exactly what the
object refuses, with its flag, before any corpus is made."""
from __future__ import annotations

import argparse

import pytest

from lmforge.cli.common import UsageError, option_flags
from lmforge.cli.tokenizer import tokenizer_options
from lmforge.config.options import OptionsError
from lmforge.tokenizer import train_tokenizer
from lmforge.tokenizer.train import DEFAULT_MIN_FREQUENCY, TokenizerOptions

# (field, a value below its bounds, one above, one inside); vocab_size's least is the kind's (wordpiece: 6)
BOUNDS = [("vocab_size", 5, 2**22 + 1, 6), ("min_frequency", 0, 10**9 + 1, 10**9)]


@pytest.mark.parametrize("name, low, high, inside", BOUNDS)
def test_each_bound_is_refused_both_ways_naming_the_field(name, low, high, inside):
    assert getattr(TokenizerOptions(**{name: inside}), name) == inside
    for bad in (low, high, "3", True, 2.5):
        with pytest.raises(OptionsError, match=name) as err:
            TokenizerOptions(**{name: bad})
        assert err.value.field == name


def test_the_least_vocabulary_is_the_kind_s_and_family_s():
    assert TokenizerOptions(kind="bytelevel-bpe", vocab_size=261).vocab_size == 261  # 256 bytes + 5 specials
    with pytest.raises(OptionsError, match=">= 261 for bytelevel-bpe with roberta special tokens"):
        TokenizerOptions(kind="bytelevel-bpe", vocab_size=260)
    assert TokenizerOptions(kind="bytelevel-bpe", family="gpt2", vocab_size=258).family_name() == "gpt2"


def test_min_frequency_is_refused_for_unigram_whenever_given():
    assert TokenizerOptions(kind="unigram").merges_least() == DEFAULT_MIN_FREQUENCY  # not given: no refusal
    for given in (DEFAULT_MIN_FREQUENCY, 5):  # the default's value too: it would be ignored all the same
        with pytest.raises(OptionsError, match="unigram merges none") as err:
            TokenizerOptions(kind="unigram", min_frequency=given)
        assert err.value.field == "min_frequency"
    with pytest.raises(OptionsError, match="unigram merges none"):
        train_tokenizer(["a b c"], "unigram", 300, min_frequency=DEFAULT_MIN_FREQUENCY)


def _parse(argv: list):
    parser = argparse.ArgumentParser()
    option_flags(parser, TokenizerOptions, required=("kind", "vocab_size"))
    return tokenizer_options(parser.parse_args(argv))


@pytest.mark.parametrize("name, low, high, inside", BOUNDS)
def test_the_flags_accept_and_refuse_as_the_object_does(name, low, high, inside):
    flag, base = "--" + name.replace("_", "-"), ["--kind", "wordpiece", "--vocab-size", "300"]
    assert _parse([*base, flag, str(inside)]) == TokenizerOptions(**{"vocab_size": 300, name: inside})
    for bad in (low, high):
        with pytest.raises(UsageError, match=f"^{flag} {bad}: must be an integer") as err:
            _parse([*base, flag, str(bad)])
        assert "\n" not in str(err.value)


def test_the_flags_defaults_and_switches_are_the_object_s():
    assert _parse(["--kind", "unigram", "--vocab-size", "300"]) == TokenizerOptions("unigram", 300)
    assert _parse(["--kind", "bpe", "--vocab-size", "300", "--lowercase", "--strip-accents"]) == \
        TokenizerOptions("bpe", 300, lowercase=True, strip_accents=True)
    with pytest.raises(SystemExit):  # argparse: the kind and the size are required on the command line
        _parse(["--kind", "bpe"])


@pytest.mark.parametrize("value, accepted", [("300.0", True), ("3e2", True), ("300.5", False), ("0", False),
                                             ("1e18", False)])
def test_the_command_reads_a_whole_number_as_python_does(value, accepted):
    from lmforge.cli import build_parser

    argv = ["tokenizer", "train", "--kind", "bpe", "--out", "x", "--vocab-size", value]
    try:  # "300.0" was refused on the command line where TokenizerOptions(vocab_size=300.0) took 300
        python = TokenizerOptions("bpe", float(value)).vocab_size == 300
    except OptionsError:
        python = False
    try:
        command = tokenizer_options(build_parser().parse_args(argv)).vocab_size == 300
    except SystemExit:  # argparse: out of bounds, or no whole number
        command = False
    assert python is command is accepted


def test_vocab_size_s_help_says_the_t5_sentinels_come_on_top_as_training_adds_them():
    """It said 'special tokens included' alone, and --family t5 --vocab-size 200 wrote 300 ids."""
    texts = ["the cat sat on the mat", "a dog ran to the cat"] * 20
    tok = train_tokenizer(texts, kind="unigram", vocab_size=80, family="t5")
    assert tok.vocab_size > 100 and tok.token_to_id("<extra_id_99>") is not None
    assert "100 <extra_id_*> on top" in TokenizerOptions.__dataclass_fields__["vocab_size"].metadata["help"]
