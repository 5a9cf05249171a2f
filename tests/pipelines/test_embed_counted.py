"""SentenceEncoder.embed_counted, the server's entry: leads go only by it (embed_with takes none, so no caller
gives a lead that covers a text), checked there, and its texts are read as given, not lowered again (the
route lowered them once, to count them as the model reads them)."""
import inspect

import pytest
import torch

from lmforge.config.options import OptionsError
from lmforge.pipelines.embed import SentenceEncoder
from lmforge.pipelines.embed_options import EmbedOptions
from tests.pipelines.test_embed import tiny_st_dir


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A tiny mean-pooled encoder that leaves the prompt out (include_prompt false)."""
    path = tiny_st_dir(tmp_path_factory.mktemp("counted") / "m", {"pooling_mode": "mean",
                                                                  "include_prompt": False})
    return SentenceEncoder.from_dir(path)


def test_embed_with_takes_no_leads(encoder):
    """embed_with(leads=[3]) of a 3-token text pooled nothing: a vector of zeros, unsaid."""
    assert "leads" not in inspect.signature(encoder.embed_with).parameters
    with pytest.raises(TypeError):
        encoder.embed_with(["a"], EmbedOptions(prompt=""), leads=[3])


@pytest.mark.parametrize("leads", [None, [0], [0, -1], [0, 1.0]])
def test_embed_counted_checks_its_leads(encoder, leads):
    with pytest.raises(OptionsError) as err:
        encoder.embed_counted(["abc def", "a"], EmbedOptions(prompt=""), 32, None, None, leads, [4, 3])
    assert err.value.field == "leads" and "2 whole numbers >= 0, one a text" in str(err.value)


def test_embed_counted_refuses_no_counts(encoder):
    with pytest.raises(OptionsError) as err:
        encoder.embed_counted(["abc def"], EmbedOptions(prompt=""), 32, None, None, [0], None)
    assert err.value.field == "counts" and str(err.value).startswith("no token counts for 1 texts")


def test_embed_counted_does_not_lower_the_texts_again(encoder, monkeypatch):
    """A lowercasing model's texts were lowered by the route, then by embed_counted, then by encode: the
    model reads embed_counted's texts as given; embed_with and encode lower theirs, as before."""
    monkeypatch.setattr(encoder, "lowercase", True)
    seen, batch = [], encoder.tokenizer.encode_batch
    monkeypatch.setattr(encoder.tokenizer, "encode_batch", lambda texts, **kw: seen.append(texts) or
                        batch(texts, **kw))
    count = len(encoder.tokenizer.encode("abc def").ids)
    lowered = encoder.embed_counted(["abc def"], EmbedOptions(prompt=""), 32, None, None, [0], [count])
    by_python = encoder.embed_with(["ABC def"], EmbedOptions(prompt=""))
    assert torch.equal(lowered.vectors, by_python.vectors) and lowered.tokens == by_python.tokens
    encoder.encode(["ABC def"])
    assert seen == [["abc def"]] * 3


def test_embed_counted_refuses_a_cased_text_for_a_lowercasing_model(encoder, monkeypatch):
    """Read as given, a cased text was embedded cased (and its counts trusted), unsaid: a public Python call
    with texts not lowered got vectors unlike embed_with's. Refused naming texts, before any text is read."""
    monkeypatch.setattr(encoder, "lowercase", True)
    monkeypatch.setattr(encoder.tokenizer, "encode_batch", lambda *a, **k: pytest.fail("encoded"))
    with pytest.raises(OptionsError) as err:
        encoder.embed_counted(["abc def", "ABC def"], EmbedOptions(prompt=""), 32, None, None, [0, 0], [4, 4])
    assert err.value.field == "texts" and str(err.value).startswith("texts[1] is not lowercased")
