"""fast/paths: FastPaths holds checked choices only (an OptionsError naming the field)."""
import pytest

import lmforge
from lmforge.fast.paths import MAX_CHUNK, FastPaths


# "no" switched a flag on; chunk=10**9 allocated a band of 10^9 keys; a text chunk failed inside a comparison
@pytest.mark.parametrize("field, value", [
    ("native_attention", "no"), ("accelerate", "no"), ("onednn_linear", 0), ("chunk", "a"),
    ("chunk", MAX_CHUNK + 1), ("chunk", -1), ("chunk", 1.5), ("sequence_min_length", None),
    ("sequence_min_length", 1.5), ("unpad", None), ("local_attention", "sparse")])
def test_a_bad_choice_is_refused_naming_its_field(field, value):
    with pytest.raises(lmforge.OptionsError) as refused:
        FastPaths(**{field: value})
    assert refused.value.field == field and field in str(refused.value)


def test_the_defaults_and_the_bounds_themselves_are_taken():
    assert FastPaths(chunk=MAX_CHUNK, sequence_min_length=0, unpad="always").chunk == MAX_CHUNK
    assert FastPaths() == FastPaths(unpad="auto", local_attention="auto", jagged_attention="auto")
