"""Matryoshka prefixes: `leading` and `cut_dimensions` cut and renormalise alike at every width."""
import re

import pytest
import torch

from lmforge.config.options import OptionsError
from lmforge.pipelines.embed_options import EmbedOptions, cut_dimensions, leading


def test_prefixes_of_every_width_compare_as_cosines_where_normalised():
    vectors = torch.randn(5, 16, generator=torch.Generator().manual_seed(0)) * 3  # not unit length
    for k in (1, 8, 16, 40):
        cut = leading(vectors, k, normalize=True)
        assert cut.shape == (5, min(k, 16))
        torch.testing.assert_close(cut.norm(dim=-1), torch.ones(5))
        if k <= 16:  # the embed option's cut is the same one
            assert torch.equal(cut, cut_dimensions(vectors, EmbedOptions(dimensions=k)))
        raw = leading(vectors, k, normalize=False)
        assert torch.equal(raw, vectors[:, :k])  # as they are without normalisation


def test_cut_dimensions_refuses_more_than_the_model_has():
    with pytest.raises(OptionsError, match="^dimensions=17: this model's embeddings have 16$") as err:
        cut_dimensions(torch.randn(2, 16), EmbedOptions(dimensions=17))
    assert err.value.field == "dimensions"
    assert cut_dimensions(torch.randn(2, 16), EmbedOptions()).shape == (2, 16)  # no dimensions: all of them


def test_max_chunks_is_refused_where_nothing_is_chunked():
    from lmforge.config.options import OptionsError
    from lmforge.pipelines.embed_options import EmbedOptions

    assert EmbedOptions(truncate="chunk", max_chunks=4).max_chunks == 4
    assert EmbedOptions(truncate=True).chunk_limit() == 16  # not given: no request
    assert EmbedOptions(truncate="chunk").chunk_limit() == 16
    for truncate, given in ((False, 4), (True, 4), (False, 16)):  # the default's value too, where given
        with pytest.raises(OptionsError, match=f'max_chunks={given}: it bounds truncate="chunk"') as err:
            EmbedOptions(truncate=truncate, max_chunks=given)
        assert err.value.field == "max_chunks"


@pytest.mark.parametrize("value, got", [(3, "3"), ([1], "[1]"), (None, "null"), ("cut", "'cut'")])
def test_truncate_is_refused_in_its_three_values_not_its_annotation(value, got):
    """truncate is true, false or "chunk": a refusal says so, not "true or false or a string"."""
    said = rf'^truncate must be true, false or "chunk", got {re.escape(got)}$'
    with pytest.raises(OptionsError, match=said):
        EmbedOptions(truncate=value)
