"""lmforge.features on texts: ELMo's words (their offsets, the scalar mix of its own layers), and the
options refused alike by the library (an OptionsError naming the field)."""
from __future__ import annotations

import re

import pytest
import torch

import lmforge
from lmforge.config.options import OptionsError


def test_elmo_features_are_its_word_layers_mixed_with_offsets():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("elmo-small")).eval()
    found = lmforge.features(["the cat  sat", "a dog"], model, layers="mix", mix_weights=[1.0, 0.0, -1.0],
                             mix_gamma=0.5)
    assert [t["text"] for t in found[0].tokens] == ["the", "cat", "sat"]
    assert [(t["start"], t["end"]) for t in found[0].tokens] == [(0, 3), (4, 7), (9, 12)]
    states = model.word_layers([["the", "cat", "sat"]])[0]
    weights = torch.softmax(torch.tensor([1.0, 0.0, -1.0]), 0)
    torch.testing.assert_close(found[0].features[0], 0.5 * (weights[:, None, None] * states).sum(0),
                               atol=1e-6, rtol=0)
    top = lmforge.features(["a dog"], model, layers=-1, pooling="mean")[0]
    torch.testing.assert_close(top.features, model.word_layers([["a", "dog"]])[0][[-1]].mean(1),
                               atol=1e-6, rtol=0)


@pytest.mark.parametrize("fields, field", [({"layers": "7"}, "layers"), ({"pooling": "first"}, "pooling"),
                                           ({"layers": "mix", "mix_weights": [1.0]}, "mix_weights"),
                                           ({"max_length": 2, "layers": 0}, "truncate")])
def test_bad_options_name_the_field(fields, field):
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("elmo-small")).eval()
    with pytest.raises(OptionsError) as err:
        lmforge.features(["the cat sat"], model, **fields)
    assert err.value.field == field


def test_elmo_reads_at_most_its_max_seq_len_words_in_the_batches_asked():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("elmo-small", max_seq_len=6)).eval()
    with pytest.raises(OptionsError, match="max_length=7: more tokens than the model reads") as err:
        lmforge.features(["the cat sat"], model, max_length=7)  # a Transformer's limit, refused alike
    assert err.value.field == "max_length"
    passes = []
    model.lstm.register_forward_hook(lambda module, args, out: passes.append(args[0].shape[0]))
    found = lmforge.features(["a b c", "d e", "f"], model, max_length=6, batch_size=2)
    assert passes == [2, 1] and [f.n_tokens for f in found] == [3, 2, 1]
    long = "a b c d e f g h"  # 8 words: refused as a Transformer's long text is, or cut to 6 and said
    with pytest.raises(OptionsError, match="8 words, more than max_length=6; send truncate=true"):
        lmforge.features([long], model)
    (cut,) = lmforge.features([long], model, truncate=True)
    assert cut.truncated and cut.n_tokens == 6 and cut.features.shape[1] == 6


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A tiny BERT reading 128 positions, saved with its tokenizer."""
    from tests.tasks.core import tiny, tokenizer

    path = tmp_path_factory.mktemp("features") / "bert"
    tiny("bert-base").save(path)
    tokenizer("bert").save(path)
    return path


LONG = "it is a good film and " * 30  # more than 128 tokens


@pytest.mark.parametrize("fields, said", [
    ({"max_length": 1000, "truncate": True}, "max_length=1000: more tokens than the model reads"),
    ({"max_length": 129}, "max_length=129: more tokens than the model reads"),
    ({"max_length": 2, "truncate": True}, "max_length=2 leaves no room next to the model's 2 special tokens"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1"),
])
def test_a_length_the_model_cannot_take_names_it(bert_dir, fields, said):
    """Past the positions the model failed naming neither field nor option; 2 failed in the tokenizer."""
    with pytest.raises(OptionsError, match=re.escape(said)) as err:
        lmforge.features([LONG], bert_dir, **fields)
    assert err.value.field == next(iter(fields))


def test_the_model_s_whole_context_is_taken(bert_dir):
    found = lmforge.features([LONG, "a film"], bert_dir, max_length=128, truncate=True, pooling="mean")
    assert found[0].truncated and len(found[0].tokens) == 128 and found[0].n_tokens == 128
    assert not found[1].truncated


@pytest.mark.parametrize("max_len", ["1000", "2"])
def test_the_command_line_refuses_them_alike(bert_dir, tmp_path, capsys, max_len):
    from lmforge.cli import main

    capsys.readouterr()
    assert main(["features", "--model", str(bert_dir), "--text", LONG, "--max-len", max_len, "--truncate",
                 "--out", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert f"error: --max-len {max_len}" in err and "max_length" not in err  # the flag, named once
    assert not (tmp_path / "out").exists()


def test_the_mix_flags_say_and_keep_their_bounds(bert_dir, tmp_path, capsys):
    from lmforge.cli import main

    with pytest.raises(SystemExit):
        main(["features", "--help"])
    assert " ".join(capsys.readouterr().out.split()).count("[-100.0, 100.0]") == 2  # weights and gamma
    with pytest.raises(SystemExit) as refused:
        main(["features", "--model", str(bert_dir), "--text", "a film", "--layers", "mix",
              "--mix-gamma", "1e9",
              "--out", str(tmp_path / "out")])
    assert refused.value.code == 2
    assert "--mix-gamma 1e9: must be in [-100.0, 100.0]" in capsys.readouterr().err


@pytest.mark.parametrize("texts", [None, 3, {"the cat": 1}, b"the cat", ["the cat", None], ["\ud800"], []])
def test_texts_that_are_not_texts_are_refused_naming_texts_before_the_model_is_read(texts):
    # None and 3 failed as "not iterable"; a dict gave its keys' features; a surrogate failed in the tokenizer
    with pytest.raises(OptionsError) as err:
        lmforge.features(texts, "no-such-model-dir")
    assert err.value.field == "texts" and "\n" not in str(err.value)


def test_a_tuple_or_a_generator_of_texts_reads_as_their_list(bert_dir):
    want = lmforge.features(["the cat", "a dog sat"], bert_dir, pooling="mean")
    for given in (("the cat", "a dog sat"), (t for t in ["the cat", "a dog sat"])):
        got = lmforge.features(given, bert_dir, pooling="mean")
        assert all(torch.equal(a.features, b.features) for a, b in zip(got, want)) and len(got) == 2


def test_a_numpy_batch_size_reads_as_python_s_int(bert_dir):
    """batch_size=np.int64(1) was refused as not an integer, where max_length=np.int64(8) (a field) passed."""
    import numpy as np

    want = lmforge.features(["the cat", "a dog sat"], bert_dir, pooling="mean", batch_size=1, max_length=8)
    got = lmforge.features(["the cat", "a dog sat"], bert_dir, pooling="mean", batch_size=np.int64(1),
                           max_length=np.int64(8))
    assert all(torch.equal(a.features, b.features) for a, b in zip(got, want))


@pytest.mark.parametrize("texts", [[""], ["a film", " \n "]])
def test_a_blank_text_is_refused_naming_texts(bert_dir, texts):
    """A blank text has no token of its own: BERT's answered [CLS] [SEP]'s features (the command line refused
    it), a decoder's mean was NaN and its cls an IndexError; the server refused it for some models only."""
    from tests.tasks.core import tiny, tokenizer

    with pytest.raises(OptionsError, match=r"the text to take features of is empty \(texts\[\d\]\)") as err:
        lmforge.features(texts, bert_dir)
    assert err.value.field == "texts"
    for pooling in ("mean", "cls"):
        with pytest.raises(OptionsError) as err:
            lmforge.features(texts, tiny("gpt2").eval(), tokenizer("gpt2"), pooling=pooling)
        assert err.value.field == "texts"
