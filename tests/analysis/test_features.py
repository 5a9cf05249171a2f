"""Contextual word features: pieces pooled per word, one tensor per sentence of every layer, the same
whatever the batch, truncation counted, and ELMo's own layers used when a model has them."""
import pytest
import torch

import lmforge
from lmforge.analysis.features import (TruncationWarning, encode_words, hidden_states, load_features,
                                       parse_layers, pool_words, save_features, word_features)
from tests.tasks.core import tiny, tokenizer

SENTENCES = [["It", "is", "superb", "."], ["I", "love", "it", "and", "it", "works", "perfectly", "."],
             ["great"]]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_pooling_first_mean_last_on_a_hand_example():
    hidden = torch.arange(10.0).view(1, 5, 2)  # (L, T, d): token t holds [2t, 2t + 1]
    word_ids = [-1, 0, 0, 1, -1]  # [CLS] w0 w0 w1 [SEP]; word 2 has no pieces
    first = pool_words(hidden, word_ids, 3, "first")
    mean = pool_words(hidden, word_ids, 3, "mean")
    last = pool_words(hidden, word_ids, 3, "last")
    assert first[0].tolist() == [[2, 3], [6, 7], [0, 0]]
    assert mean[0].tolist() == [[3, 4], [6, 7], [0, 0]]
    assert last[0].tolist() == [[4, 5], [6, 7], [0, 0]]
    with pytest.raises(ValueError, match="^pooling 'max'"):
        pool_words(hidden, word_ids, 3, "max")


@pytest.mark.parametrize("spec, layers", [
    (None, [0, 1, 2, 3]),
    ("all", [0, 1, 2, 3]),
    ("mix", [0, 1, 2, 3]),
    (2, [2]),
    ("1-3", [1, 2, 3]),
    ("0,3", [0, 3]),
    ("3,1-2", [1, 2, 3]),
])
def test_layer_selections(spec, layers):
    assert parse_layers(spec, 4) == layers


@pytest.mark.parametrize("spec", ["4", "2-9", "a", "1-", "-5", ""])
def test_bad_layer_selections_name_the_field_from_python_and_the_flag_on_the_command_line(spec):
    """parse_layers said "--layers '4': ...", a flag a Python caller of word_features never gave: from Python
    the field (layers), on the command line (probe, features --data) the flag, named once, the value kept."""
    from lmforge.cli.analysis import feature_layers
    from lmforge.cli.common import UsageError
    from lmforge.config.options import OptionsError

    with pytest.raises(OptionsError) as python:
        parse_layers(spec, 4)
    assert str(python.value).startswith("layers") and "--" not in str(python.value)
    assert python.value.field == "layers"
    with pytest.raises(UsageError) as cli:
        feature_layers(spec, lmforge.build(lmforge.tiny("bert-base", n_layers=3)))
    assert str(cli.value).startswith(f"--layers {spec!r}") and "layers" not in str(cli.value)[8:]


def test_a_selection_too_long_is_said_once_on_the_command_line_as_features_text_says_it():
    """feature_layers (probe, features --data) said "--layers '<4097 characters>': layers has 4097
    characters, ...": the value echoed whole and the field named after the flag; features --text says
    "--layers has 4097 characters, ..." (named_once), and so does it now."""
    from types import SimpleNamespace

    from lmforge.analysis.feature_options import MAX_SPEC_CHARS
    from lmforge.cli.analysis import feature_layers
    from lmforge.cli.analysis_probe import feature_options
    from lmforge.cli.common import UsageError

    spec = "0" * (MAX_SPEC_CHARS + 1)
    with pytest.raises(UsageError) as data:
        feature_layers(spec, lmforge.build(lmforge.tiny("bert-base", n_layers=3)))
    args = SimpleNamespace(layers=spec, mix_weights=None, mix_gamma=None, pooling=None, max_len=None,
                           truncate=False, text=["a b"])
    with pytest.raises(UsageError) as text:
        feature_options(args)
    assert str(data.value) == f"--layers has {MAX_SPEC_CHARS + 1} characters, more than {MAX_SPEC_CHARS}"
    assert str(text.value) == str(data.value)


def test_a_bad_pooling_or_layers_of_word_features_names_the_field():
    """word_features(pooling="max") said "--pooling 'max' ..." and a bad layers "--layers ...": the fields."""
    from lmforge.config.options import OptionsError

    model, tok = tiny("bert-base").eval(), tokenizer("bert")
    with pytest.raises(OptionsError) as pooling:
        word_features(model, tok, SENTENCES, pooling="max")
    assert str(pooling.value).startswith("pooling 'max' is not one of") and pooling.value.field == "pooling"
    with pytest.raises(OptionsError) as layers:
        word_features(model, tok, SENTENCES, layers="7")
    assert str(layers.value).startswith("layers '7': outside") and layers.value.field == "layers"


def test_one_tensor_per_sentence_of_every_layer_at_each_words_first_piece():
    model, tok = tiny("bert-base").eval(), tokenizer("bert")
    features = word_features(model, tok, SENTENCES, pooling="first")
    assert [tuple(f.shape) for f in features] == [(3, len(s), model.config.d_model) for s in SENTENCES]
    example, kept = encode_words(tok, SENTENCES[1], 128)
    ids = torch.tensor([example["input_ids"]])
    hidden = hidden_states(model, ids, torch.ones_like(ids), torch.tensor([example["segment_ids"]]))
    first_piece = [example["word_ids"].index(w) for w in range(kept)]
    assert torch.allclose(features[1], hidden[:, 0, first_piece], atol=1e-6)
    chosen = word_features(model, tok, SENTENCES, layers="1-2")
    assert all(torch.equal(c, f[1:]) for c, f in zip(chosen, features))


@pytest.mark.parametrize("preset, family", [("bert-base", "bert"), ("gpt2", "gpt2"), ("t5-base", "t5")])
def test_features_do_not_depend_on_the_batch_neighbours(preset, family):
    model, tok = tiny(preset).eval(), tokenizer(family)
    alone = word_features(model, tok, [SENTENCES[0]], pooling="mean")[0]
    batched = word_features(model, tok, [SENTENCES[1], SENTENCES[0], SENTENCES[2]], pooling="mean",
                            batch_size=3)[1]
    assert torch.allclose(alone, batched, atol=1e-5)
    assert alone.shape[0] == model.config.n_layers + 1  # an encoder-decoder: its encoder's layers


def test_a_decoder_sees_the_left_context_only():
    model, tok = tiny("gpt2").eval(), tokenizer("gpt2")
    a, b = word_features(model, tok, [["It", "is", "superb"], ["It", "is", "flimsy"]], pooling="last")
    assert torch.allclose(a[:, :2], b[:, :2], atol=1e-6)  # the first two words cannot see the third
    assert not torch.allclose(a[:, 2], b[:, 2])
    enc, tok = tiny("bert-base").eval(), tokenizer("bert")
    a, b = word_features(enc, tok, [["It", "is", "superb"], ["It", "is", "flimsy"]])
    assert not torch.allclose(a[1:, :2], b[1:, :2])  # an encoder's do


def test_sentences_past_the_max_length_are_cut_with_a_counted_warning():
    model, tok = tiny("bert-base").eval(), tokenizer("bert")
    long = ["superb"] * 20
    stats = {}
    with pytest.warns(TruncationWarning, match="1 of 2 sentences exceed max_len=8 tokens.*14 words dropped"):
        features = word_features(model, tok, [long, SENTENCES[0]], max_len=8, stats=stats)
    assert features[0].shape[1] == 6 and features[1].shape[1] == 4  # 8 tokens - [CLS], [SEP]
    assert stats == {"truncated_sentences": 1, "dropped_words": 14}


def test_max_len_is_bounded_by_the_models_positions():
    model, tok = tiny("bert-base").eval(), tokenizer("bert")
    for bad in (0, 2, model.config.max_seq_len + 1):  # 0 meant "the default" once, silently
        with pytest.raises(ValueError, match=f"max_len must be >= 3 and <= the model's .*got {bad}$"):
            word_features(model, tok, SENTENCES, max_len=bad)
    assert len(word_features(model, tok, SENTENCES, max_len=3)) == len(SENTENCES)


def test_the_scalar_mix_settings_need_the_mix():
    from lmforge.analysis.feature_options import FeatureOptions
    from lmforge.config.options import OptionsError

    assert FeatureOptions(layers="mix", mix_gamma=2.0).mix_gamma == 2.0
    assert FeatureOptions(layers="mix").mix(3)[1] == 1.0  # not given: gamma 1
    for given in (2.0, 1.0):  # the default's value too, where given: it would be ignored
        with pytest.raises(OptionsError, match=f"mix_gamma={given} needs layers=mix") as err:
            FeatureOptions(layers="all", mix_gamma=given)
        assert err.value.field == "mix_gamma"


def test_a_model_with_its_own_word_layers_gives_them():
    model = lmforge.build(lmforge.tiny("elmo-small"))
    features = word_features(model, None, SENTENCES[:2], layers="1-2")
    assert [tuple(f.shape) for f in features] == [(2, 4, 64), (2, 8, 64)]
    own = model.word_layers(SENTENCES[:2])
    assert all(torch.allclose(f, o[1:3], atol=1e-6) for f, o in zip(features, own))


def test_elmo_runs_the_batch_size_asked_and_cuts_past_its_max_seq_len_with_a_count():
    model = lmforge.build(lmforge.tiny("elmo-small", max_seq_len=6))
    passes = []
    model.lstm.register_forward_hook(lambda module, args, out: passes.append(args[0].shape[0]))
    stats: dict = {}
    with pytest.warns(TruncationWarning, match="1 of 3 sentences exceed max_len=6"):
        features = word_features(model, None, SENTENCES, batch_size=2, stats=stats)
    assert passes == [2, 1]  # 3 sentences, 2 a pass (word_layers' default would run them in one)
    assert [f.shape[1] for f in features] == [4, 6, 1]
    assert stats == {"truncated_sentences": 1, "dropped_words": 2}
    assert torch.allclose(features[1], word_features(model, None, [SENTENCES[1][:6]])[0], atol=1e-6)


def test_features_round_trip_through_safetensors(tmp_path):
    features = [torch.randn(3, n, 5) for n in (4, 1, 7)]
    file = save_features(tmp_path, features, {"model": "m", "layers": [0, 1, 2]})
    back, meta = load_features(file)
    assert meta == {"model": "m", "layers": [0, 1, 2]}
    assert all(torch.equal(a, b) for a, b in zip(features, back))
    assert file.read_bytes()[:8] != b"\x80\x04\x95"  # safetensors, never a pickle


@pytest.mark.parametrize("damage", ["value", "meta", "cut"])
def test_features_are_verified_on_read(tmp_path, damage):
    """A flipped bit of a feature (or of the layers in its meta) was read as other features, and a cut file
    was a library error naming no file (helper's probe)."""
    from lmforge.io import CheckpointError

    file = save_features(tmp_path, [torch.ones(2, 3, 4)], {"model": "m", "layers": [0, 1]})
    data = bytearray(file.read_bytes())
    if damage == "value":
        data[-40] ^= 1  # inside the features (offsets are the last 16 bytes)
    elif damage == "meta":
        at = bytes(data).index(b"[0, 1]")
        data[at + 4] = ord("2")  # still JSON, still a safetensors header: other layers
    else:
        data = data[: len(data) // 2]
    file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as refused:
        load_features(file)
    assert str(file) in str(refused.value) and "\n" not in str(refused.value)


def test_save_features_refuses_a_link_as_its_folder(tmp_path):
    from lmforge.analysis.features import save_features
    from lmforge.utils.atomic import UnsafePath

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "f").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(UnsafePath, match="f: is a symbolic link"):
        save_features(tmp_path / "f", [torch.zeros(2, 3, 4)], {})
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("preset, family", [("bert-base", "bert"), ("gpt2", "gpt2")])
def test_layer_0_is_the_embedding_output_and_layer_l_the_lth_blocks(preset, family):
    """Hidden state 0 is what the first block reads, l (0 < l < L) what block l - 1 writes, and L the top
    block's output (under a pre-norm stack's final norm, as Hugging Face's last hidden state)."""
    model, tok = tiny(preset).eval(), tokenizer(family)
    stack = model.encoder if model.config.architecture == "encoder" else model.decoder
    seen = []
    hooks = [stack.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(a[0]))]
    hooks += [b.register_forward_hook(lambda m, a, out: seen.append(out[0] if isinstance(out, tuple)
                                                                   else out)) for b in stack.blocks]
    example, kept = encode_words(tok, SENTENCES[1], 128)
    ids = torch.tensor([example["input_ids"]])
    with torch.no_grad():
        hidden = hidden_states(model, ids, torch.ones_like(ids), torch.tensor([example["segment_ids"]]))
    for h in hooks:
        h.remove()
    L = model.config.n_layers
    assert hidden.shape[0] == L + 1 and len(seen) == L + 1
    for layer in range(L):
        torch.testing.assert_close(hidden[layer], seen[layer].view_as(hidden[layer]), atol=1e-6, rtol=0)
    top = seen[L].view_as(hidden[L])
    torch.testing.assert_close(hidden[L], stack.final_norm(top) if stack.final_norm is not None else top,
                               atol=1e-6, rtol=0)
    features = word_features(model, tok, [SENTENCES[1]], pooling="mean")[0]
    word_ids = torch.tensor(example["word_ids"])
    for w in range(kept):  # mean: of the word's own pieces only, at every layer
        torch.testing.assert_close(features[:, w], hidden[:, 0, word_ids == w].mean(1), atol=1e-6, rtol=0)
    torch.testing.assert_close(word_features(model, tok, [SENTENCES[1]], layers=-1, pooling="mean")[0],
                               features[-1:], atol=0, rtol=0)


def test_a_transformers_scalar_mix_is_gamma_times_the_softmax_weighted_layers():
    """ELMo eq. 1 over a BERT's hidden states: gamma * sum_j softmax(s)_j h_j, layer 0 the embeddings."""
    model, tok = tiny("bert-base").eval(), tokenizer("bert")
    s = [2.0, -1.0, 0.5]
    mixed = lmforge.features(["It is superb ."], model, tok, layers="mix", mix_weights=s, mix_gamma=0.5)[0]
    each = lmforge.features(["It is superb ."], model, tok, layers="all")[0]
    assert mixed.features.shape[0] == 1 and each.features.shape[0] == model.config.n_layers + 1
    w = torch.softmax(torch.tensor(s, dtype=torch.float64), 0).float()
    torch.testing.assert_close(mixed.features[0], 0.5 * (w[:, None, None] * each.features).sum(0), atol=1e-6,
                               rtol=1e-6)
