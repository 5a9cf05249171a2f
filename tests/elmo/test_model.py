"""ELMo (Peters et al. 2018): presets, character ids, the biLM's directions, state, saving."""
import pytest
import torch

import lmforge
from lmforge.config import ConfigError
from lmforge.elmo import ELMo
from lmforge.model import from_config
from lmforge.presets import ELMO_PRESETS
from lmforge.tokenizer.chars import sentence_chars, word_chars

SENTENCES = [["The", "dog", "sleeps", "."], ["Sileafe", "lies", "on", "the", "Ure", "river", "."], ["Hi"]]


def tiny_elmo(**overrides) -> ELMo:
    torch.manual_seed(0)
    return lmforge.build(lmforge.tiny("elmo-small", **overrides)).eval()


# AllenNLP's models page lists the biLM without its softmax; our count (num_parameters, heads excluded)
# is character table, CNN, highways, projection and both directions' LSTMs
PUBLISHED_M = {"elmo-small": 13.6, "elmo-medium": 28.0, "elmo-original": 93.6}


@pytest.mark.parametrize("name", list(PUBLISHED_M))
def test_parameter_counts_match_allennlp(name):
    cfg = lmforge.get_config(name)
    with torch.device("meta"):
        model = from_config(cfg, init=False)
    assert type(model) is ELMo
    count = model.num_parameters()
    assert abs(count / 1e6 - PUBLISHED_M[name]) <= 0.01 * PUBLISHED_M[name], f"{name}: {count / 1e6:.2f}M"
    # the count from the sizes: LSTMP per direction and layer 4c(d_in + d) + 4c + c d; highway 2(f^2 + f)
    c, d, f = cfg.lstm_dim, cfg.d_model, 2048
    lstm = 2 * cfg.n_layers * (4 * c * 2 * d + 4 * c + c * d)
    cnn = sum(w * 16 * n + n for w, n in cfg.cnn_filters)
    assert count == 262 * 16 + cnn + cfg.n_highway * 2 * (f * f + f) + f * d + d + lstm


def test_presets_name_their_sources_and_the_paper_sizes():
    for name, preset in ELMO_PRESETS.items():
        assert preset["source"] and lmforge.get_config(name).source == preset["source"]
    cfg = lmforge.get_config("elmo-original")
    assert (cfg.n_layers, cfg.lstm_dim, cfg.d_model, cfg.n_highway, cfg.cell_clip, cfg.proj_clip) == \
        (2, 4096, 512, 2, 3.0, 3.0)
    assert sum(n for _, n in cfg.cnn_filters) == 2048 and cfg.skip_connections and not cfg.stateful


def test_bad_elmo_fields_are_refused_by_name():
    for bad, field in ((dict(char_filters=[[1]]), "char_filters"),
                       (dict(char_filters=[[51, 4]]), "char_filters"),
                       (dict(cell_clip=-1.0), "cell_clip"), (dict(n_highway=-1), "n_highway"),
                       (dict(lstm_dim=0), "lstm_dim"),
                       (dict(char_filters=[[1, 10_000_000]]), "char_filters"),  # was said as n_layers' memory
                       (dict(char_filters=[[1, 8]] * 9000), "char_filters")):
        with pytest.raises(ConfigError, match=field) as refused:
            lmforge.get_config("elmo-small", **bad)
        assert refused.value.field == field


def test_a_character_table_or_word_width_too_small_for_the_character_ids_is_refused_by_name():
    """n_characters=100 and max_characters_per_token=2 were built, then word_layers failed with an
    IndexError and a ragged-tensor error."""
    from lmforge.config.checks import ELMO_CHARACTERS

    # tokenizer/chars.py's
    assert ELMO_CHARACTERS == max(word_chars("\xff")) + 1 == max(word_chars("</S>")) + 1
    for bad, field in ((dict(n_characters=ELMO_CHARACTERS - 1), "n_characters"),
                       (dict(max_characters_per_token=2, char_filters=[[1, 8]]), "max_characters_per_token")):
        with pytest.raises(ConfigError, match=f"^{field}=.* must be at least") as err:
            lmforge.get_config("elmo-small", **bad)
        assert err.value.field == field
    model = lmforge.build(lmforge.tiny("elmo-small", max_characters_per_token=3, char_filters=[[1, 8]]))
    assert model.word_layers([["<S>", "word"]])[0].shape[1] == 2  # the narrowest word still holds a mark


def test_character_ids_follow_allennlp():
    # bytes + 1 between begin-of-word 258+1 and end-of-word 259+1, padded with 260+1; <S> is 256+1
    assert word_chars("hi")[:5] == [259, 105, 106, 260, 261] and len(word_chars("hi")) == 50
    assert word_chars("<S>")[:4] == [259, 257, 260, 261] and word_chars("</S>")[1] == 258
    assert word_chars("é")[1:3] == [0xC3 + 1, 0xA9 + 1]  # UTF-8 bytes
    long = word_chars("x" * 80)
    assert long[0] == 259 and long[48] == 121 and long[49] == 260  # cut to 48 bytes, the end mark kept
    chars, mask = sentence_chars([["a", "b"], ["c"]])
    assert chars.shape == (2, 4, 50) and mask.tolist() == [[True] * 4, [True, True, True, False]]
    assert chars[1, 3].eq(0).all() and chars[1, 2, 1] == 258  # a padding word is zeros; </S> ends row 1


def test_word_layers_shapes_and_layer_zero_duplicated():
    model = tiny_elmo()
    layers = model.word_layers(SENTENCES)
    d = model.config.d_model
    assert [tuple(x.shape) for x in layers] == [(3, len(s), 2 * d) for s in SENTENCES]
    first = layers[0][0]
    torch.testing.assert_close(first[:, :d], first[:, d:], rtol=0, atol=0)
    # the same sentence alone or in a batch with longer ones: padding changes nothing
    alone = model.word_layers([SENTENCES[2]])[0]
    torch.testing.assert_close(alone, layers[2], atol=1e-6, rtol=1e-5)


def _grad_of_prediction(model, direction, position, chars, mask):
    """Gradient of one top-layer state w.r.t. every word's character embeddings: (T,) norms."""
    embedded = {}

    def keep(module, args, output):
        output.retain_grad()
        embedded["x"] = output

    hook = model.chars.embed.register_forward_hook(keep)
    try:
        out = model(chars, mask)
    finally:
        hook.remove()
    states = out.forward_states if direction == "forward" else out.backward_states
    states[-1][0, position].sum().backward()
    grad = torch.zeros(chars.shape[1])
    grad[mask[0]] = embedded["x"].grad.abs().sum((1, 2))  # real words, in order
    return grad


def test_each_lm_prediction_never_sees_the_word_it_predicts():
    """The forward LM predicts word t from h->_(t-1): zero gradient w.r.t. words t and after; the backward
    LM predicts word t from h<-_(t+1): zero gradient w.r.t. words t and before."""
    model = tiny_elmo().train()  # dropout on: a dropped unit must not open a path either
    chars, mask = sentence_chars([["a", "quiet", "dog", "sleeps", "near", "the", "door"]])
    T = chars.shape[1]
    for t in range(1, T - 1):
        fwd = _grad_of_prediction(model, "forward", t - 1, chars, mask)
        assert fwd[t:].eq(0).all() and fwd[:t].gt(0).all(), (t, fwd)
        bwd = _grad_of_prediction(model, "backward", t + 1, chars, mask)
        assert bwd[: t + 1].eq(0).all() and bwd[t + 1:].gt(0).all(), (t, bwd)


def test_clipping_bounds_cells_and_outputs():
    model = tiny_elmo(cell_clip=0.05, proj_clip=0.01)
    for layer in model.lstm.forward_layers:
        torch.nn.init.normal_(layer.input_linearity.weight, std=3.0)
    chars, mask = sentence_chars(SENTENCES)
    out = model(chars, mask)
    first = out.forward_states[0]  # no residual on the first layer: the clipped projection itself
    assert first.abs().max() <= 0.01 + 1e-7 and first.abs().max() > 0.009
    _, (h, c) = model.lstm.forward_layers[0](out.token, mask)
    assert c.abs().max() <= 0.05 + 1e-7


def test_stateless_by_default_stateful_carries_state():
    chars, mask = sentence_chars(SENTENCES)
    model = tiny_elmo()
    first = model(chars, mask).last_hidden_state
    torch.testing.assert_close(model(chars, mask).last_hidden_state, first, rtol=0, atol=0)
    stateful = tiny_elmo(stateful=True)
    torch.testing.assert_close(stateful(chars, mask).last_hidden_state, first, rtol=0, atol=0)  # from zeros
    carried = stateful(chars, mask).last_hidden_state
    assert not torch.allclose(carried[mask], first[mask])
    assert all(not h.requires_grad for direction in stateful.states for h, _ in direction)
    stateful.reset_state()
    torch.testing.assert_close(stateful(chars, mask).last_hidden_state, first, rtol=0, atol=0)
    assert stateful.word_layers(SENTENCES)[0].shape[0] == 3  # features never read the carried state


def test_a_stateful_batch_of_another_size_fits_the_carried_rows_as_allennlp_does():
    """AllenNLP's stateful encoder: a smaller batch starts from the first carried rows and the others keep
    theirs; a larger one starts its new rows from zeros."""
    chars, mask = sentence_chars(SENTENCES)
    model = tiny_elmo(stateful=True)
    model(chars, mask)
    carried = [[(h.clone(), c.clone()) for h, c in direction] for direction in model.states]
    reference = tiny_elmo(stateful=True)
    reference.states = [[(h[:2], c[:2]) for h, c in direction] for direction in carried]
    torch.testing.assert_close(model(chars[:2], mask[:2]).last_hidden_state,
                               reference(chars[:2], mask[:2]).last_hidden_state, rtol=0, atol=0)
    for direction, kept, ref in zip(model.states, carried, reference.states):
        for (h, c), (old_h, old_c), (ref_h, ref_c) in zip(direction, kept, ref):
            assert torch.equal(h[:2], ref_h) and torch.equal(c[:2], ref_c)
            assert torch.equal(h[2:], old_h[2:]) and torch.equal(c[2:], old_c[2:])
    model.reset_state()
    model(chars[:1], mask[:1])  # one row carried; a batch of three starts rows 1 and 2 from zeros
    reference.states = [[tuple(torch.cat([t, t.new_zeros(2, t.shape[1])]) for t in hc) for hc in direction]
                        for direction in model.states]
    torch.testing.assert_close(model(chars, mask).last_hidden_state, reference(chars, mask).last_hidden_state,
                               rtol=0, atol=0)


def test_bad_inputs_are_one_line_errors():
    model = tiny_elmo()
    chars, mask = sentence_chars(SENTENCES)
    with pytest.raises(ValueError, match=r"char_ids must be an int64 or int32 tensor \(batch, words, 50\)"):
        model(chars[..., :10])
    with pytest.raises(ValueError, match="right padding"):
        model(chars, mask.flip(1))
    with pytest.raises(ValueError, match="outside"):
        model(chars + 300)
    with pytest.raises(ValueError, match=r"word_layers\(sentences\)\[1\] must be a non-empty list"):
        model.word_layers([["a"], []])


def test_save_load_round_trip_and_hf_refusal(tmp_path):
    from lmforge.heads import make_head

    model = tiny_elmo()
    model.add_head("softmax", make_head(model, "lm"))
    model.save(tmp_path / "m")
    loaded = lmforge.load(tmp_path / "m").eval()
    assert type(loaded) is ELMo and loaded.config == model.config and list(loaded.heads) == ["softmax"]
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    chars, mask = sentence_chars(SENTENCES)
    torch.testing.assert_close(loaded(chars, mask).last_hidden_state, model(chars, mask).last_hidden_state,
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="transformers has no ELMo"):
        model.save(tmp_path / "hf", format="hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True, "8", None, 10**6])
def test_a_word_layers_batch_size_outside_its_bounds_is_refused_by_name(batch_size):
    """-1 had given a list of None (an empty range of batches), 0 range()'s own error; a whole 2.0 is 2,
    as every other batch_size reads it."""
    with pytest.raises(lmforge.OptionsError, match=r"^batch_size") as refused:
        tiny_elmo().word_layers(SENTENCES, batch_size=batch_size)
    assert refused.value.field == "batch_size"
    assert len(tiny_elmo().word_layers(SENTENCES, batch_size=2.0)) == len(SENTENCES)


def test_char_ids_that_embedding_cannot_index_and_a_mask_that_is_no_tensor_are_refused_by_name():
    model = tiny_elmo()
    chars, mask = sentence_chars(SENTENCES)
    for bad in (chars.to(torch.uint8), chars.bool(), chars.double()):
        with pytest.raises(ValueError, match=rf"char_ids must be an int64 or int32 tensor .*{bad.dtype}"):
            model(bad)
    with pytest.raises(ValueError, match="attention_mask must be a tensor"):
        model(chars, mask.tolist())
    as_int32 = model(chars.int(), mask).last_hidden_state
    torch.testing.assert_close(as_int32, model(chars, mask).last_hidden_state)


def test_the_residual_adds_the_dropped_input_as_bilm_tf_does():
    """bilm-tf wraps each layer as DropoutWrapper(ResidualWrapper(cell)): the second layer's residual adds the
    input the cell read, dropout applied (a doubling stands in for a dropout mask here)."""
    model = tiny_elmo().train()
    model.lstm.dropout = torch.nn.Identity()
    chars, mask = sentence_chars(SENTENCES)
    clean = model(chars, mask).forward_states[0]
    model.lstm.dropout = DOUBLING
    out = model(chars, mask).forward_states
    second, _ = model.lstm.forward_layers[1](2 * out[0], mask)
    torch.testing.assert_close(out[1], second + 2 * out[0] * mask[..., None], rtol=0, atol=1e-6)
    assert not torch.allclose(out[1], second + out[0] * mask[..., None])
    assert not torch.allclose(clean, out[0])  # the first layer read the doubled tokens too


class _Doubling(torch.nn.Module):
    def forward(self, x):
        return 2 * x


DOUBLING = _Doubling()
