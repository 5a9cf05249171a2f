"""The options machinery (lmforge.config.options) judges every value as one OptionsError naming the field."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lmforge.config.options import Items, OptionsError, check_options, from_dict, option


@dataclasses.dataclass
class Probe:
    """Fields with no upper bound: an int, a list of ints, a union and an optional int."""

    count: int = option(1, "no upper bound", low=0)
    ids: list = option(None, "ids", low=0, items=Items("int", max_items=4), factory=list)
    either: int | str = option(1, "an int or a word")
    maybe: int | None = option(None, "an optional int")

    def __post_init__(self):
        check_options(self)


@pytest.mark.parametrize("name, value", [("count", 10**400), ("ids", [10**400]), ("either", 10**400),
                                         ("maybe", -10**400), ("count", float("inf"))])
def test_an_integer_past_float_s_range_is_an_options_error_naming_the_field(name, value):
    with pytest.raises(OptionsError) as err:
        Probe(**{name: value})
    assert err.value.field == name and "\n" not in str(err.value)



@dataclasses.dataclass
class Unions:
    """A union admitting an int and no float (int | str), and one admitting no text (int | list)."""

    either: int | str = option(1, "an int or a word")
    ids: int | list | None = option(None, "an id or a list of ids")

    def __post_init__(self):
        check_options(self)


@pytest.mark.parametrize("name", ["either", "ids"])
def test_a_union_with_an_int_reads_a_whole_number_as_an_int_field_does(name):
    texts = (("2", True), ("2.0", True)) if name == "ids" else ()  # int | str keeps "2" as the word it may be
    for value, from_text in ((2.0, False), (np.float32(2.0), False), *texts):
        built = from_dict(Unions, {name: value}, from_text=from_text)
        assert getattr(built, name) == 2 and type(getattr(built, name)) is int, (value, from_text)
    for value in (2.5, float("nan")):
        with pytest.raises(OptionsError) as err:
            Unions(**{name: value})
        assert err.value.field == name
    with pytest.raises(OptionsError) as err:  # text no number is left to the check, which names the field
        from_dict(Unions, {"ids": "two"}, from_text=True)
    assert err.value.field == "ids"
    assert from_dict(Unions, {"either": "every-other"}, from_text=True).either == "every-other"


@pytest.mark.parametrize("data", [[1, 2], 3, None, "count=2"])
def test_options_that_are_no_mapping_are_an_options_error_naming_the_whole_options(data):
    with pytest.raises(OptionsError, match="Probe options must be a mapping") as err:
        from_dict(Probe, data)
    assert err.value.field == "options"
