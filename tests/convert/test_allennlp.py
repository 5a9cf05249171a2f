"""AllenNLP's published ELMo format (options JSON + bilm-tf hdf5): a small file written here in that
exact layout loads, and the model reproduces a reference forward pass written from the paper's
equations on the raw TensorFlow arrays (its gate order and forget bias); malformed files are refused
in one line naming the file and the dataset; `lmforge convert` brings such a directory in."""
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.convert.allennlp import AllenNLPFormatError, load_allennlp
from lmforge.io import CheckpointError
from lmforge.tokenizer.chars import sentence_chars

FILTERS = [[1, 4], [2, 5], [3, 6]]  # (width, n): 15 filters
E, D, C, HIGHWAY = 4, 6, 8, 2  # character embedding, projection_dim, LSTM cells, highway layers
OPTIONS = {"lstm": {"dim": C, "projection_dim": D, "n_layers": 2, "cell_clip": 3, "proj_clip": 3,
                    "use_skip_connections": True},
           "char_cnn": {"activation": "relu", "embedding": {"dim": E}, "filters": FILTERS,
                        "n_highway": HIGHWAY, "n_characters": 262, "max_characters_per_token": 50},
           "n_tokens_vocab": 100}
SENTENCES = [["The", "dog", "sleeps", "."], ["Ure", "rivers", "run", "to", "the", "sea", "!"]]


def tf_arrays(seed: int = 0) -> dict:
    """bilm-tf's variables by their hdf5 names (the LSTM weights large enough for the clips to act)."""
    rng = np.random.default_rng(seed)

    def normal(*shape, std=0.5):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    f = sum(n for _, n in FILTERS)
    arrays = {"char_embed": normal(261, E, std=1.0)}
    for i, (width, n) in enumerate(FILTERS):
        arrays[f"CNN/W_cnn_{i}"], arrays[f"CNN/b_cnn_{i}"] = normal(1, width, E, n), normal(n, std=0.1)
    for k in range(HIGHWAY):
        for part in ("carry", "transform"):
            arrays[f"CNN_high_{k}/W_{part}"], arrays[f"CNN_high_{k}/b_{part}"] = \
                normal(f, f, std=0.3), normal(f)
    arrays["CNN_proj/W_proj"], arrays["CNN_proj/b_proj"] = normal(f, D), normal(D, std=0.1)
    for j in range(2):
        for layer in range(2):
            cell = f"RNN_{j}/RNN/MultiRNNCell/Cell{layer}/LSTMCell/"
            arrays[cell + "W_0"], arrays[cell + "B"] = normal(2 * D, 4 * C, std=1.0), normal(4 * C)
            arrays[cell + "W_P_0"] = normal(C, D, std=1.5)
    return arrays


def write_allennlp(folder, arrays: dict, options: dict = OPTIONS) -> tuple:
    """options.json and weights.hdf5 in the published layout (nested groups, as h5py writes paths)."""
    folder.mkdir(parents=True, exist_ok=True)
    options_file, weight_file = folder / "elmo_options.json", folder / "elmo_weights.hdf5"
    options_file.write_text(json.dumps(options))
    with h5py.File(weight_file, "w") as handle:
        for name, value in arrays.items():
            handle.create_dataset(name, data=value)
    return options_file, weight_file


# ---- the reference: Peters et al. 2018 (sec. 3) and bilm-tf's equations on the raw arrays, in numpy ----

def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def token_layer(a: dict, chars: np.ndarray) -> np.ndarray:
    """(n, 50) character ids -> (n, D): CNN, max over positions, relu, highways, projection."""
    table = np.concatenate([np.zeros((1, E), np.float32), a["char_embed"]])  # id 0 pads words
    x = table[chars].astype(np.float64)  # (n, 50, E)
    pooled = []
    for i, (width, n) in enumerate(FILTERS):
        w = a[f"CNN/W_cnn_{i}"][0]  # (width, E, n): TF's conv2d on a (1, width) window, cross-correlation
        windows = np.stack([x[:, p: p + width] for p in range(x.shape[1] - width + 1)], 1)  # (n, P, width, E)
        conv = np.einsum("npwe,wek->npk", windows, w) + a[f"CNN/b_cnn_{i}"]
        pooled.append(np.maximum(conv.max(1), 0.0))
    h = np.concatenate(pooled, -1)
    for k in range(HIGHWAY):  # bilm-tf: carry_gate * relu(transform) + (1 - carry_gate) * x
        g = sigmoid(h @ a[f"CNN_high_{k}/W_carry"] + a[f"CNN_high_{k}/b_carry"])
        h = g * np.maximum(h @ a[f"CNN_high_{k}/W_transform"] + a[f"CNN_high_{k}/b_transform"], 0) + \
            (1 - g) * h
    return h @ a["CNN_proj/W_proj"] + a["CNN_proj/b_proj"]


def lstm_layer(a: dict, j: int, layer: int, x: np.ndarray, seen: dict) -> np.ndarray:
    """TF's LSTMCell(num_proj, cell_clip, proj_clip, forget_bias=1) over (T, D) inputs in order."""
    cell = f"RNN_{j}/RNN/MultiRNNCell/Cell{layer}/LSTMCell/"
    h, c, out = np.zeros(D), np.zeros(C), []
    for t in range(len(x)):
        # TF: i, j, f, o
        i, new, f, o = np.split(np.concatenate([x[t], h]) @ a[cell + "W_0"] + a[cell + "B"], 4)
        c = np.clip(sigmoid(f + 1.0) * c + sigmoid(i) * np.tanh(new), -3, 3)
        seen["cell"] = max(seen["cell"], np.abs(c).max())
        h = np.clip((sigmoid(o) * np.tanh(c)) @ a[cell + "W_P_0"], -3, 3)
        seen["proj"] = max(seen["proj"], np.abs(h).max())
        out.append(h)
    return np.stack(out)


def reference_layers(a: dict, chars: np.ndarray, seen: dict) -> np.ndarray:
    """(3, T, 2D) for one sentence's (T, 50) characters: [x; x], then [h->; h<-] per layer, the second
    layer with its skip connection; the backward LM reads the sentence reversed."""
    x = token_layer(a, chars)
    layers = [np.concatenate([x, x], -1)]
    fwd, bwd = x, x[::-1]
    for layer in range(2):
        f_out, b_out = lstm_layer(a, 0, layer, fwd, seen), lstm_layer(a, 1, layer, bwd, seen)
        if layer > 0:
            f_out, b_out = f_out + fwd, b_out + bwd
        layers.append(np.concatenate([f_out, b_out[::-1]], -1))
        fwd, bwd = f_out, b_out
    return np.stack(layers)


# frozen values of the reference on the first sentence, (layer, position, dimension): a change to the
# reference or to the arrays' generator shows here instead of passing unnoticed
FROZEN = {(2, 1, 0): 0.535016, (2, 1, D): -0.684506, (1, 3, 2): -0.871237}


def test_a_published_layout_file_reproduces_the_reference_forward_pass(tmp_path):
    arrays = tf_arrays()
    model = load_allennlp(*write_allennlp(tmp_path, arrays))
    assert model.config.cnn_filters == FILTERS and model.config.lstm_dim == C and model.config.d_model == D
    chars, mask = sentence_chars(SENTENCES, 50)  # <S> w .. </S>, right-padded: the second row is longer
    with torch.no_grad():
        ours = model(chars, mask).layers().double().numpy()  # (3, B, T, 2D)
    seen = {"cell": 0.0, "proj": 0.0}
    for b, n in enumerate(mask.sum(1).tolist()):
        expected = reference_layers(arrays, chars[b, :n].numpy(), seen)
        np.testing.assert_allclose(ours[:, b, :n], expected, rtol=1e-4, atol=1e-5)
        assert not ours[:, b, n:].any()  # padding stays zero
        if b == 0:
            for (layer, t, d), value in FROZEN.items():
                assert expected[layer, t, d] == pytest.approx(value, abs=1e-4)
    assert seen["cell"] == 3.0 and seen["proj"] == 3.0  # both clips were reached, so both are tested
    words = model.word_layers(SENTENCES)  # the same states with <S> and </S> dropped
    assert torch.allclose(words[1].double(), torch.from_numpy(ours[:, 1, 1:8]), atol=1e-6)


def _refused(tmp_path, arrays=None, options=OPTIONS, match=""):
    options_file, weight_file = write_allennlp(tmp_path, tf_arrays() if arrays is None else arrays, options)
    with pytest.raises(AllenNLPFormatError, match=match) as err:
        load_allennlp(options_file, weight_file)
    assert "\n" not in str(err.value)
    return options_file, weight_file


def test_malformed_files_are_refused_naming_file_and_dataset(tmp_path):
    arrays = tf_arrays()
    del arrays["CNN_high_1/W_carry"]
    _refused(tmp_path / "a", arrays, match=r"elmo_weights.hdf5: dataset CNN_high_1/W_carry is missing")
    arrays = tf_arrays()
    arrays["RNN_1/RNN/MultiRNNCell/Cell0/LSTMCell/W_P_0"] = np.zeros((C, D + 1), np.float32)
    _refused(tmp_path / "b", arrays, match=r"elmo_weights.hdf5: dataset RNN_1/RNN/MultiRNNCell/Cell0/"
                                           r"LSTMCell/W_P_0 has shape \(8, 7\), expected \(8, 6\)")
    options_file, weight_file = _refused(tmp_path / "c", options={**OPTIONS, "lstm": {"dim": C}},
                                         match=r"elmo_options.json: field lstm.projection_dim is missing")
    weight_file.write_bytes(b"not hdf5 at all")
    options_file.write_text(json.dumps(OPTIONS))
    with pytest.raises(AllenNLPFormatError, match=r"elmo_weights.hdf5: not an HDF5 weight file"):
        load_allennlp(options_file, weight_file)


@pytest.mark.parametrize("value", ["false", 1.5, 0, []])
def test_use_skip_connections_must_be_a_boolean(tmp_path, value):
    """bool() read "false" and 1.5 as true: skip connections the weights were not trained with."""
    from lmforge.convert.allennlp import read_options

    def options_file(skip) -> Path:
        lstm = {k: v for k, v in OPTIONS["lstm"].items() if k != "use_skip_connections"}
        return write_allennlp(tmp_path, {}, {**OPTIONS, "lstm": {**lstm, "use_skip_connections": skip}})[0]

    said = r"elmo_options.json: lstm.use_skip_connections must be true or false, got "
    with pytest.raises(AllenNLPFormatError, match=said) as err:
        read_options(options_file(value))
    assert "\n" not in str(err.value)
    for skip, built in ((True, True), (False, False), (None, False)):  # null: none, as the key left out
        assert read_options(options_file(skip)).skip_connections is built


def test_convert_brings_an_allennlp_directory_in(tmp_path, capsys):
    source, dst = tmp_path / "allennlp", tmp_path / "ours"
    arrays = tf_arrays()
    write_allennlp(source, arrays)
    assert main(["convert", str(source), str(dst)]) == 0
    model, direct = lmforge.load(dst), load_allennlp(*write_allennlp(tmp_path / "again", arrays))
    assert type(model).__name__ == "ELMo" and model.config.d_model == D
    assert all(torch.equal(v, direct.state_dict()[k]) for k, v in model.state_dict().items())
    capsys.readouterr()
    assert main(["convert", str(source), str(tmp_path / "hf"), "--to", "hf"]) == 2  # no ELMo in transformers
    assert "no Hugging Face format" in capsys.readouterr().err
    del arrays["CNN_proj/b_proj"]
    write_allennlp(tmp_path / "broken", arrays)
    assert main(["convert", str(tmp_path / "broken"), str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "elmo_weights.hdf5: dataset CNN_proj/b_proj is missing" in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_loading_an_allennlp_directory_directly_points_to_convert(tmp_path):
    write_allennlp(tmp_path / "allennlp", tf_arrays())
    with pytest.raises(CheckpointError,
                       match=r"config.json is missing \(AllenNLP's ELMo weights\? .*lmforge convert"):
        lmforge.load(tmp_path / "allennlp")
