"""One request, checked once, in Python and on the command line as the server checks it: a text over the
limit refused unless truncate says otherwise (whatever else is given), no texts or texts that are not
text, a keyword beside options=, and `lmforge embed`'s option flags made from EmbedOptions (their bounds)."""
import json
import re

import pytest
import torch

import lmforge
from lmforge.cli import build_parser, main
from lmforge.config.options import OptionsError
from lmforge.pipelines.embed_options import EmbedOptions
from tests.pipelines.test_embed import tiny_st_dir

LONG = " ".join("abcdefghijklmnopqrstuvwxyz")  # 26 tokens and 2 special ones: more than the model's 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny sentence-transformers BERT whose texts may have 16 tokens (sentence_bert_config.json)."""
    return tiny_st_dir(tmp_path_factory.mktemp("embed") / "model", {"pooling_mode": "mean"})


@pytest.mark.parametrize("keywords", [{}, {"dimensions": 8}, {"normalize": False},
                                      {"options": EmbedOptions()}, {"batch_size": 1}])
def test_a_text_over_the_limit_is_refused_whatever_else_is_given(model_dir, keywords):
    """It was cut silently unless an embedding option was given too."""
    said = "^text 1 is 28 tokens, more than the model's limit of 16"
    with pytest.raises(OptionsError, match=said) as refused:
        lmforge.embed(["a b", LONG], model=model_dir, **keywords)
    assert refused.value.field == "truncate"


@pytest.mark.parametrize("flags", [[], ["--dimensions", "8"], ["--no-normalize"], ["--out", "e.npy"]])
def test_the_command_line_refuses_it_alike(model_dir, tmp_path, monkeypatch, capsys, flags):
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["embed", "--model", str(model_dir), "a b", LONG, *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "--truncate: text 1 is 28 tokens" in err, err
    assert not (tmp_path / "e.npy").exists()


def test_truncate_true_cuts_to_the_first_tokens_and_says_so(model_dir, capsys):
    cut = lmforge.embed([LONG], model=model_dir, truncate=True)
    first = lmforge.embed([" ".join("abcdefghijklmn")], model=model_dir)  # the 14 beside [CLS] and [SEP]
    torch.testing.assert_close(cut, first, atol=1e-6, rtol=0)
    assert main(["embed", "--model", str(model_dir), LONG, "--truncate", "true"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["tokens"] == 16 and line["truncated"] is True
    torch.testing.assert_close(torch.tensor([line["embedding"]]), cut, atol=1e-6, rtol=0)


def test_max_length_without_room_for_a_token_names_max_length(model_dir, capsys):
    said = "max_length=2 leaves no room next to the model's 2 special"
    with pytest.raises(OptionsError, match=said) as refused:
        lmforge.embed(["a b"], model=model_dir, max_length=2, truncate=True)
    assert refused.value.field == "max_length"
    capsys.readouterr()
    assert main(["embed", "--model", str(model_dir), "a b", "--max-length", "2", "--truncate", "true"]) == 2
    assert capsys.readouterr().err.startswith(f"lmforge embed: error: --max-length: {said}")


@pytest.mark.parametrize("keywords, width", [
    ({}, 32), ({"dimensions": 8}, 8), ({"encoding_format": "ubinary"}, 4),
    ({"encoding_format": "base64"}, 32),
    ({"truncate": "chunk", "max_chunks": 2}, 32), ({"batch_invariant": True, "normalize": False}, 32),
])
def test_no_texts_are_refused_naming_texts_whatever_the_options(model_dir, keywords, width):
    """One rule on every face: the server refuses an empty request (422) and the command line too (exit 2);
    Python's embed([]) gave a (0, d) array (sentence-transformers' answer) where they refused."""
    assert lmforge.embed(["a"], model=model_dir, **keywords).shape == (1, width)
    with pytest.raises(OptionsError) as refused:
        lmforge.embed([], model=model_dir, **keywords)
    assert refused.value.field == "texts" and "non-empty" in str(refused.value)


@pytest.mark.parametrize("texts, said", [
    ([1, 2], "texts[0] must be text, got int"), (["a", None], "texts[1] must be text, got NoneType"),
    (None, "texts must be a text or a list of texts, got NoneType"), (b"a b", "got bytes"),
    ({"a": 1}, "got dict"), ({"b", "a"}, "got set (unordered"),
    (["\ud800"], "texts[0] is not valid Unicode"),
])
def test_texts_that_are_not_text_name_texts_before_the_model_is_read(tmp_path, texts, said):
    with pytest.raises(OptionsError, match=re.escape(said)) as refused:
        lmforge.embed(texts, model=tmp_path / "missing")
    assert refused.value.field == "texts" and "\n" not in str(refused.value)


def test_a_keyword_beside_options_is_applied_not_dropped(model_dir):
    raw = lmforge.embed(["a b c"], model=model_dir, options=EmbedOptions(), normalize=False)
    torch.testing.assert_close(raw, lmforge.embed(["a b c"], model=model_dir, normalize=False))
    assert abs(float(raw.norm()) - 1) > 0.1  # not normalised
    cut = lmforge.embed(["a b c"], model=model_dir, options=EmbedOptions(dimensions=8), normalize=False)
    torch.testing.assert_close(cut, raw[:, :8])  # the options' dimensions and the keyword's normalize
    kept = lmforge.embed(["a b c"], model=model_dir, options=EmbedOptions(normalize=False), dimensions=None)
    torch.testing.assert_close(kept, raw)  # a keyword left as None changes nothing


def _flag(name: str):
    embed = next(a for a in build_parser()._actions if a.choices and "embed" in a.choices).choices["embed"]
    return next(a for a in embed._actions if name in a.option_strings)


@pytest.mark.parametrize("field, flag", [("dimensions", "--dimensions"), ("max_chunks", "--max-chunks")])
def test_option_flags_take_and_say_the_bounds_of_embed_options(field, flag, capsys):
    meta = EmbedOptions.__dataclass_fields__[field].metadata
    bounds = f"[{meta['low']}, {meta['high']}]"
    action = _flag(flag)
    assert action.type.bounds == (meta["low"], meta["high"]) and bounds in action.help
    with pytest.raises(SystemExit) as refused:
        main(["embed", "--model", "unused", "x", "--truncate", "chunk", flag, "1e18"])
    assert refused.value.code == 2
    assert f"{flag} 1e18: must be in {bounds}" in capsys.readouterr().err


def test_numpy_numbers_as_arguments_read_as_the_options_fields_read_them(model_dir):
    """embed(dimensions=np.int64(8)) passed (an EmbedOptions field) where max_length=np.int64(8) and
    batch_size=np.int64(2) were refused as not integers: each is now Python's int of its value,
    bounds kept."""
    import numpy as np

    want = lmforge.embed(["a b c", LONG], model=model_dir, max_length=8, batch_size=2, truncate=True)
    got = lmforge.embed(["a b c", LONG], model=model_dir, max_length=np.int64(8), batch_size=np.int32(2),
                        truncate=True, dimensions=np.int64(32))
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    for bad in ({"max_length": np.int64(0)}, {"batch_size": np.int64(0)}, {"batch_size": np.float32(2.5)}):
        with pytest.raises(OptionsError) as refused:
            lmforge.embed(["a b"], model=model_dir, **bad)
        assert refused.value.field == next(iter(bad))


@pytest.mark.parametrize("progress", [3, "yes", True])
def test_a_progress_that_is_no_function_is_refused_before_any_work(progress, monkeypatch):
    """embed(..., progress=3) failed as "'int' object is not callable" once the first batch was embedded;
    it is now refused naming progress before the model is read (a missing model is never looked for)."""
    from lmforge.pipelines import embed as module

    read = []
    monkeypatch.setattr(module, "_encoder", lambda *args: read.append(args))
    with pytest.raises(OptionsError, match="^progress must be a function of the texts done") as refused:
        lmforge.embed(["a b"], model="no-such-model", progress=progress)
    assert refused.value.field == "progress" and read == []


def test_a_loaded_encoder_refuses_it_before_encoding(model_dir):
    from lmforge.pipelines.embed import SentenceEncoder

    encoder = SentenceEncoder.from_dir(model_dir)
    encoder.model.forward = None  # any pass through the model would fail otherwise
    for run in (encoder.encode, encoder.embed_with):
        with pytest.raises(OptionsError) as refused:
            run(["a b"], progress=3)
        assert refused.value.field == "progress"


def test_sentence_encoder_encode_bounds_batch_size_as_embed_does():
    """encode had its own check (< 1 a ValueError, no upper bound, 2.0 failed inside range())."""
    import numpy as np

    from lmforge.pipelines.embed import MAX_BATCH_SIZE, SentenceEncoder

    encoder = SentenceEncoder.from_dir("all-MiniLM-L6-v2")
    want = encoder.encode(["a b", "c"], batch_size=2)
    assert torch.equal(encoder.encode(["a b", "c"], batch_size=2.0), want)
    assert torch.equal(encoder.encode(["a b", "c"], batch_size=np.int64(2)), want)
    for bad in (0, MAX_BATCH_SIZE + 1, 2.5, True):
        with pytest.raises(OptionsError) as err:
            encoder.encode(["a"], batch_size=bad)
        assert err.value.field == "batch_size"


def test_the_prompt_alone_is_tokenised_once_a_call_for_its_room_and_its_pooling(tmp_path):
    """embed_with tokenised the prompt alone twice (the room check, then the tokens include_prompt false
    leaves out of the pooling); once now, the room check reading the prompt's own tokens as before."""
    from lmforge.pipelines.embed import SentenceEncoder

    path = tiny_st_dir(tmp_path, {"pooling_mode": "mean", "include_prompt": False})
    encoder = SentenceEncoder.from_dir(path)
    prompt, encode, alone = "x y ", encoder.tokenizer.encode, []
    encoder.tokenizer.encode = lambda text, *a, **kw: alone.append(text == prompt) or encode(text, *a, **kw)
    found = encoder.embed_with(["abc def", "a"], EmbedOptions(prompt=prompt))
    assert sum(alone) == 1 and found.vectors.shape[0] == 2, alone
    length = encoder.prompt_length(prompt)
    assert length.tokens == len(encode(prompt, add_special_tokens=False).ids) == 2
    assert (length.specials, length.lead) == (2, 3)  # [CLS] x y [SEP]: [CLS] x y lead a text


def test_no_prompt_has_no_length_and_is_not_encoded(tmp_path):
    """prompt_length("") is None, nothing encoded: its callers (embed_with, the server's /embed route) each
    wrote `prompt_length(prefix) if prefix else None`; a prompt's length is measured as before."""
    from lmforge.pipelines.embed import SentenceEncoder

    encoder = SentenceEncoder.from_dir(tiny_st_dir(tmp_path, {"pooling_mode": "mean"}))
    encode, seen = encoder.tokenizer.encode, []
    encoder.tokenizer.encode = lambda text, *a, **kw: seen.append(text) or encode(text, *a, **kw)
    assert encoder.prompt_length("") is None and seen == []
    assert encoder.prompt_length("x y ").tokens == 2 and seen == ["x y "]


def _counted(encoder, texts: list, options: EmbedOptions, leads: list):
    """embed_counted as the server calls it: texts that hold their prompt, counted by the same tokenizer."""
    counts = [len(encoder.tokenizer.encode(t).ids) for t in texts]
    return encoder.embed_counted(texts, options, 32, None, None, leads, counts)


def test_leads_leave_each_texts_own_prompt_out_in_one_call(tmp_path):
    """embed_counted's leads: texts that hold their prompt (the server's), prompts mixed in one batch, pool as
    each prompt given in the options pools; leads that do not fit are refused naming leads."""
    from lmforge.pipelines.embed import SentenceEncoder

    path = tiny_st_dir(tmp_path, {"pooling_mode": "mean", "include_prompt": False})
    encoder = SentenceEncoder.from_dir(path)
    asked = [("x y ", "abc def"), ("a b c ", "the dog"), ("", "a")]
    leads = [encoder.prompt_length(p).lead if p else 0 for p, _ in asked]
    mixed = _counted(encoder, [p + t for p, t in asked], EmbedOptions(prompt=""), leads).vectors
    for row, (prompt, text) in enumerate(asked):
        alone = encoder.embed_with([text], EmbedOptions(prompt=prompt)).vectors[0]
        assert torch.allclose(mixed[row], alone, atol=1e-5), row
    for bad, options in (([1], EmbedOptions(prompt="")), ([1, -1], EmbedOptions(prompt="")),
                         ([1, 1], EmbedOptions(prompt="x "))):
        with pytest.raises(OptionsError) as err:
            _counted(encoder, ["a", "b"], options, bad)
        assert err.value.field == "leads"


def test_a_python_caller_cannot_pass_counts_that_would_cut_a_text_unsaid(tmp_path):
    """embed_with(counts=[3]) for a 50-token text was trusted: no refusal, the text cut at 16 tokens, said to
    be 3 and not cut. embed_with counts every text itself; the server's counts go by embed_counted, which
    says it trusts them (public: the server module calls it), and give what embed_with's own counts give."""
    from lmforge.pipelines.embed import SentenceEncoder

    encoder = SentenceEncoder.from_dir(tiny_st_dir(tmp_path, {"pooling_mode": "mean"}))
    long = "the lazy dog jumps over the quick brown fox again and again"
    with pytest.raises(TypeError):
        encoder.embed_with([long], counts=[3])
    with pytest.raises(OptionsError) as err:
        encoder.embed_with([long])
    assert err.value.field == "truncate"
    texts = ["abc def", "a"]
    own = encoder.embed_with(texts)
    given = encoder.embed_counted(texts, None, 32, None, None, [0, 0], list(own.tokens))  # the server's
    assert given.tokens == own.tokens == [8, 3] and torch.equal(given.vectors, own.vectors)


@pytest.mark.parametrize("counts", [[8], [8, 3, 3]], ids=["fewer", "more"])
def test_embed_counted_refuses_counts_not_one_per_text(tmp_path, counts):
    """embed_counted (public since 94ca65a4) zipped texts with counts: one count short gave the last text a
    vector of zeros and no count, unsaid; now an OptionsError naming counts."""
    from lmforge.pipelines.embed import SentenceEncoder

    encoder = SentenceEncoder.from_dir(tiny_st_dir(tmp_path, {"pooling_mode": "mean"}))
    with pytest.raises(OptionsError) as err:
        encoder.embed_counted(["abc def", "a"], None, 32, None, None, [0, 0], counts)
    assert err.value.field == "counts" and f"{len(counts)} token counts for 2 texts" in str(err.value)

def test_a_lead_and_another_texts_windows_share_one_call(tmp_path):
    """One text with a lead, another of no prompt in windows (two requests in one server batch): each pools
    as alone; the chunk refusal of a left-out prompt was the batch's, so both failed and ran again alone."""
    from lmforge.pipelines.embed import SentenceEncoder

    path = tiny_st_dir(tmp_path, {"pooling_mode": "mean", "include_prompt": False})
    encoder = SentenceEncoder.from_dir(path)
    chunk, lead = EmbedOptions(prompt="", truncate="chunk"), encoder.prompt_length("x y ").lead
    both = _counted(encoder, ["x y abc def", LONG], chunk, [lead, 0])
    assert both.chunks == [1, 2]
    alone = encoder.embed_with(["abc def"], EmbedOptions(prompt="x y ", truncate="chunk")).vectors[0]
    assert torch.allclose(both.vectors[0], alone, atol=1e-5)
    assert torch.allclose(both.vectors[1], encoder.embed_with([LONG], chunk).vectors[0], atol=1e-5)
    with pytest.raises(OptionsError) as err:  # the text in windows with a lead is still refused
        _counted(encoder, [LONG, "a"], chunk, [lead, 0])
    assert err.value.field == "truncate"
