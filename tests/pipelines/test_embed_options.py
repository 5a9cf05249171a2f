"""Matryoshka prefixes: `leading` and `cut_dimensions` cut and renormalise alike at every width; the
calibration ranges file read and written, a damaged one refused naming it."""
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


@pytest.mark.parametrize("field", ["prompt", "prompt_name"])
def test_a_prompt_that_is_not_unicode_is_refused_naming_it(field):
    """A lone surrogate failed in the tokenizer, after the model was read, as a ValueError naming "text"."""
    with pytest.raises(OptionsError, match=f"^{field} is not valid Unicode: surrogates not allowed") as err:
        EmbedOptions(**{field: "query: \ud800"})
    assert err.value.field == field
    assert EmbedOptions(prompt="query: \u00e9").prompt == "query: \u00e9"


@pytest.mark.parametrize("content", ["[1]", "not json", '{"all/normalized": [1]}',
                                     '{"all/normalized": {"min": [0]}}',
                                     '{"all/normalized": {"min": 0, "max": 1}}',
                                     '{"all/normalized": {"min": ["a"], "max": [1]}}',
                                     '{"all/normalized": {"min": [NaN], "max": [1]}}',
                                     '{"all/normalized": {"min": [0, 0], "max": [1]}}',
                                     '{"all/normalized": {"min": [2], "max": [1]}}'])
def test_a_damaged_ranges_file_is_refused_naming_it(tmp_path, content):
    """embedding_ranges.json of another shape (a hand edit, another tool's file) is a ValueError naming the
    file, read for int8 / uint8 or added to by --calibrate, never a KeyError or NaN scaled to zeros."""
    from lmforge.pipelines.embed_options import RANGES_FILE, read_ranges, save_ranges

    (tmp_path / RANGES_FILE).write_text(content)
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / RANGES_FILE))):
        read_ranges(tmp_path, EmbedOptions())
    if not content.startswith("{"):  # --calibrate keeps the other dimensions' ranges: it must read them
        with pytest.raises(ValueError, match=re.escape(str(tmp_path / RANGES_FILE))):
            save_ranges(tmp_path, torch.zeros(2, 1), EmbedOptions())


def test_calibrated_ranges_are_read_back(tmp_path):
    from lmforge.pipelines.embed_options import read_ranges, save_ranges

    save_ranges(tmp_path, torch.tensor([[0.0, -1.0], [1.0, 2.0]]), EmbedOptions())
    low, high = read_ranges(tmp_path, EmbedOptions())
    assert low.tolist() == [0.0, -1.0] and high.tolist() == [1.0, 2.0]
    assert read_ranges(tmp_path, EmbedOptions(dimensions=1)) is None  # another key: not calibrated


@pytest.mark.parametrize("encoding", ["int8", "uint8", "binary", "ubinary"])
def test_quantized_codes_equal_sentence_transformers_quantize_embeddings(encoding):
    """int8 / uint8 were rounded where sentence-transformers floors: a step apart in about half the
    coordinates; a constant calibrated coordinate steps by 1 as there, values beyond the range clamp."""
    from lmforge.pipelines.embed_options import quantize

    util = pytest.importorskip("sentence_transformers.util")
    torch.manual_seed(0)
    calibration, vectors = torch.randn(20, 19), torch.randn(6, 19) * 1.5
    calibration[:, 3] = 0.25  # one constant coordinate
    ranges = (calibration.min(0).values, calibration.max(0).values)
    ours = quantize(vectors, encoding, ranges)
    theirs = util.quantize_embeddings(vectors.numpy(), encoding, calibration_embeddings=calibration.numpy())
    assert ours.numpy().dtype == theirs.dtype and (ours.numpy() == theirs).all()


def test_max_length_is_an_embedding_option_given_once():
    """max_length is one of EmbedOptions' fields, so /embed takes it as lmforge.embed and `lmforge embed` do
    (it had been an argument of its own, which the server refused); given both ways, it must agree."""
    from lmforge.pipelines.embed import SentenceEncoder
    from tests.tasks.core import tiny, tokenizer

    encoder = SentenceEncoder(tiny(), tokenizer())
    texts = ["the film was long and the actors were good", "a cat"]
    by_argument = encoder.embed_with(texts, EmbedOptions(truncate=True), max_length=5)
    by_option = encoder.embed_with(texts, EmbedOptions(truncate=True, max_length=5))
    assert torch.equal(by_argument.vectors, by_option.vectors) and by_option.truncated[0]
    assert encoder.embed_with(texts, EmbedOptions(truncate=True, max_length=5), max_length=5).truncated[0]
    with pytest.raises(OptionsError, match="give it once") as err:
        encoder.embed_with(texts, EmbedOptions(truncate=True, max_length=6), max_length=5)
    assert err.value.field == "max_length"


def test_more_dimensions_than_the_model_has_are_refused_before_any_text_is_encoded(monkeypatch):
    """embed_with checked dimensions only after encoding every text; now by the one rule cut_dimensions uses,
    first; within the width, the vectors are the normalised prefix of the full ones."""
    from lmforge.pipelines.embed import SentenceEncoder
    from tests.tasks.core import tiny, tokenizer

    encoder = SentenceEncoder(tiny(), tokenizer())
    width, texts = encoder.model.config.d_model * len(encoder.pooling), ["a cat", "the film was long"]
    full = encoder.embed_with(texts, EmbedOptions(normalize=False)).vectors
    assert torch.allclose(encoder.embed_with(texts, EmbedOptions(dimensions=4)).vectors,
                          leading(full, 4, normalize=True))
    monkeypatch.setattr(SentenceEncoder, "_encode", lambda *a, **k: pytest.fail("encoded before the check"))
    with pytest.raises(OptionsError, match=f"^dimensions={width + 1}: this model's embeddings have {width}$"):
        encoder.embed_with(texts, EmbedOptions(dimensions=width + 1))
