"""utils.errors.shown / elided: every refusal repeats a value the one way, bounded whatever its size."""
import pytest

from lmforge.config.options import check_value
from lmforge.utils.errors import SHOWN, OptionsError, elided, shown


def test_a_short_value_is_shown_as_its_repr():
    assert shown("bert") == "'bert'" and shown([1, 2]) == "[1, 2]" and shown(None) == "None"


def test_a_long_value_keeps_its_head_and_tail_and_counts_what_is_left_out():
    value = "a" * 5000 + "z"
    said = shown(value)
    assert said.startswith("'aaa") and said.endswith("az'")  # the tail (a closing quote, a unit) survives
    assert f"({len(repr(value)) - SHOWN} characters left out)" in said
    assert len(said) < 2 * SHOWN + 40  # one short line


def test_elided_leaves_none_and_short_text_alone():
    assert elided(None, 10) is None and elided("short", 10) == "short"


def test_an_option_refusal_cuts_the_value_the_same_way():
    with pytest.raises(OptionsError) as err:
        check_value("top_k", "int", {}, "9" * 4000)
    assert shown("9" * 4000) in str(err.value) and len(str(err.value)) < 200


def test_a_value_a_little_over_the_bound_is_shown_whole_not_grown_by_the_cut():
    """The cut's marker is about 30 characters: a 43-character repr came back as 73, 3 of it hidden."""
    for n in (41, 45, 60):
        value = "a" * n
        assert shown(value) == repr(value)
    said = shown("a" * 5000)
    assert "a" * (SHOWN // 2 + 1) not in said and len(said) < len(repr("a" * 5000))
