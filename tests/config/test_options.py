"""The options machinery (lmforge.config.options) judges every value as one OptionsError naming the field."""
from __future__ import annotations

import dataclasses

import pytest

from lmforge.config.options import Items, OptionsError, check_options, option


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
