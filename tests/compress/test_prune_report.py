"""run_prune, the Python face of `lmforge prune --method ffn|heads`: a method or sparsity it cannot take
is an OptionsError naming the field, before any model is read (a sparsity given as text was a TypeError)."""
from __future__ import annotations

import math

import pytest

from lmforge.compress.prune_report import run_prune
from lmforge.config.options import OptionsError


@pytest.mark.parametrize("method, sparsity, field", [
    ("ffx", 0.5, "method"), ("ffn", 0, "sparsity"), ("ffn", 1, "sparsity"), ("heads", -0.5, "sparsity"),
    ("ffn", math.nan, "sparsity"), ("ffn", "0.5", "sparsity"), ("ffn", True, "sparsity"),
    ("ffn", None, "sparsity"),
])
def test_a_bad_method_or_sparsity_is_refused_naming_it(tmp_path, method, sparsity, field):
    with pytest.raises(OptionsError, match=f"^--{field} ") as err:
        run_prune(tmp_path / "no-model", [], tmp_path / "out", method, sparsity)
    assert err.value.field == field and "\n" not in str(err.value) and not (tmp_path / "out").exists()
