"""AllenNLP's published ELMo format: an options JSON and an hdf5 weight file in bilm-tf's layout.

The options give the sizes (`lstm`: dim, projection_dim, n_layers, cell_clip, proj_clip,
use_skip_connections; `char_cnn`: embedding.dim, filters, n_highway, n_characters,
max_characters_per_token, activation). The weight file holds TensorFlow's variables (the softmax
is not in it), read here by one declarative map, each dataset with the shape it must have:

    char_embed                         (n_characters - 1, e)  our row 0 (a padding word) stays zero
    CNN/W_cnn_i, CNN/b_cnn_i           (1, width, e, n), (n,)  -> Conv1d (n, e, width)
    CNN_high_k/W_carry|W_transform     (f, f) as x @ W        -> transposed; b_carry|b_transform (f,)
    CNN_proj/W_proj, b_proj            (f, d), (d,)
    RNN_j/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0   (d_in + d, 4c): [x; h] @ W, gates (i, j, f, o)
                                        .../B     (4c,), TF's LSTMCell adds 1 to f at run time
                                        .../W_P_0 (c, d): the projection
    (j = 0 the forward LM, 1 the backward one)

TensorFlow's gate order (input, new input j, forget, output) becomes ours (input, forget, cell
input, output) and the forget bias gets TF's +1 (AllenNLP's elmo_lstm.load_weights does the same).
A file that is not hdf5, lacks a dataset or has one of another shape is refused in one line naming
the file and the dataset.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from lmforge.config import ConfigError, ModelConfig
from lmforge.elmo import ELMo
from lmforge.presets import ELMO
from lmforge.utils import jsontext
from lmforge.utils.errors import shown

LSTM = "RNN_{j}/RNN/MultiRNNCell/Cell{l}/LSTMCell/"
TF_TO_OURS = (0, 2, 1, 3)  # our gate g takes TF's block 2 (f), ... : (i, j, f, o) -> (i, f, j, o)


class AllenNLPFormatError(ValueError):
    """An options or weight file that is not AllenNLP's ELMo format; the message names file and field."""


def _field(options: dict, path: str, where: Path):
    value = options
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise AllenNLPFormatError(f"{where}: field {path} is missing")
        value = value[key]
    return value


def read_options(path) -> ModelConfig:
    """The ModelConfig of an AllenNLP options JSON (vocab_size: its n_tokens_vocab, else the 1B Word
    Benchmark's)."""
    path = Path(path)
    try:
        options = jsontext.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise AllenNLPFormatError(f"{path}: not a readable options JSON ({err})") from None
    activation = _field(options, "char_cnn.activation", path)
    if activation != "relu":
        raise AllenNLPFormatError(f"{path}: char_cnn.activation={activation!r}: only relu (every released "
                                  f"ELMo) is implemented")
    fields = dict(lstm_dim="lstm.dim", d_model="lstm.projection_dim", n_layers="lstm.n_layers",
                  cell_clip="lstm.cell_clip", proj_clip="lstm.proj_clip",
                  char_embed_dim="char_cnn.embedding.dim", char_filters="char_cnn.filters",
                  n_highway="char_cnn.n_highway", n_characters="char_cnn.n_characters",
                  max_characters_per_token="char_cnn.max_characters_per_token")
    values = {name: _field(options, key, path) for name, key in fields.items()}
    skip = options["lstm"].get("use_skip_connections")
    if skip is not None and not isinstance(skip, bool):  # bool() took "false" and 1.5 as true
        raise AllenNLPFormatError(f"{path}: lstm.use_skip_connections must be true or false, "
                                  f"got {shown(skip)}")
    values["skip_connections"] = bool(skip)
    values["vocab_size"] = options.get("n_tokens_vocab", ELMO["vocab_size"])
    try:
        return ModelConfig.from_dict({**ELMO, **values, "source": f"AllenNLP options {path.name}"})
    except ConfigError as err:
        raise AllenNLPFormatError(f"{path}: {err}") from None


def _lstm_matrix(w: np.ndarray, d_in: int, part: str) -> np.ndarray:
    """W_0 (d_in + d, 4c) -> our input (4c, d_in) or state (4c, d) matrix, gates reordered."""
    blocks = np.split(w.T, 4, axis=0)  # 4 x (c, d_in + d)
    ours = np.concatenate([blocks[k] for k in TF_TO_OURS], axis=0)
    return ours[:, :d_in] if part == "input" else ours[:, d_in:]


def _lstm_bias(b: np.ndarray) -> np.ndarray:
    blocks = np.split(b.copy(), 4)
    blocks[2] += 1.0  # TF's forget_bias: added at run time there, part of the bias here
    return np.concatenate([blocks[k] for k in TF_TO_OURS])


def weight_map(cfg: ModelConfig) -> list:
    """(our parameter, dataset, the dataset's shape, fix: numpy array -> our array) for every weight."""
    e, d, c = cfg.char_embed_dim, cfg.d_model, cfg.lstm_dim
    f = sum(n for _, n in cfg.cnn_filters)
    T = np.transpose
    rules = [("chars.embed.weight", "char_embed", (cfg.n_characters - 1, e),
              lambda w: np.concatenate([np.zeros((1, e), w.dtype), w]))]
    for i, (width, n) in enumerate(cfg.cnn_filters):
        rules += [(f"chars.convs.{i}.weight", f"CNN/W_cnn_{i}", (1, width, e, n),
                   lambda w: w[0].transpose(2, 1, 0)),
                  (f"chars.convs.{i}.bias", f"CNN/b_cnn_{i}", (n,), np.asarray)]
    for k in range(cfg.n_highway):
        for ours, theirs in (("carry", "carry"), ("transform", "transform")):
            rules += [(f"chars.highways.{k}.{ours}.weight", f"CNN_high_{k}/W_{theirs}", (f, f), T),
                      (f"chars.highways.{k}.{ours}.bias", f"CNN_high_{k}/b_{theirs}", (f,), np.asarray)]
    rules += [("chars.projection.weight", "CNN_proj/W_proj", (f, d), T),
              ("chars.projection.bias", "CNN_proj/b_proj", (d,), np.asarray)]
    for j, direction in enumerate(("forward", "backward")):
        for layer in range(cfg.n_layers):
            ours, theirs = f"lstm.{direction}_layers.{layer}.", LSTM.format(j=j, l=layer)
            rules += [(ours + "input_linearity.weight", theirs + "W_0", (2 * d, 4 * c),
                       lambda w: _lstm_matrix(w, d, "input")),
                      (ours + "state_linearity.weight", theirs + "W_0", (2 * d, 4 * c),
                       lambda w: _lstm_matrix(w, d, "state")),
                      (ours + "state_linearity.bias", theirs + "B", (4 * c,), _lstm_bias),
                      (ours + "state_projection.weight", theirs + "W_P_0", (c, d), T)]
    return rules


def read_weights(path, cfg: ModelConfig) -> dict:
    """Our state dict from an hdf5 weight file; AllenNLPFormatError naming the file and dataset."""
    import h5py

    path = Path(path)
    try:
        handle = h5py.File(path, "r")
    except OSError as err:
        raise AllenNLPFormatError(f"{path}: not an HDF5 weight file ({err})") from None
    state = {}
    with handle:
        for ours, name, shape, fix in weight_map(cfg):
            dataset = handle.get(name)
            if not isinstance(dataset, h5py.Dataset):
                raise AllenNLPFormatError(f"{path}: dataset {name} is missing (needed for {ours})")
            if tuple(dataset.shape) != shape:
                raise AllenNLPFormatError(f"{path}: dataset {name} has shape {tuple(dataset.shape)}, "
                                          f"expected {shape} from the options")
            state[ours] = torch.from_numpy(np.ascontiguousarray(fix(dataset[...]), dtype=np.float32))
    return state


def allennlp_files(path) -> tuple | None:
    """(options JSON, hdf5 weights) of a directory in AllenNLP's layout (one of each, no config.json, as
    the published elmo_*_options.json and elmo_*_weights.hdf5 sit side by side); None for any other path."""
    path = Path(path)
    if not path.is_dir() or (path / "config.json").exists():
        return None
    weights = sorted(p for p in path.iterdir() if p.suffix.lower() in (".hdf5", ".h5"))
    options = sorted(p for p in path.iterdir() if p.suffix.lower() == ".json")
    if not weights:
        return None
    if len(weights) != 1 or len(options) != 1:
        raise AllenNLPFormatError(f"{path}: an AllenNLP ELMo directory holds one options .json and one .hdf5 "
                                  f"weight file; found {len(options)} and {len(weights)}")
    return options[0], weights[0]


def load_allennlp(options_file, weight_file) -> ELMo:
    """The ELMo model of an AllenNLP options JSON and hdf5 weight file, in eval mode (no softmax head:
    the files have none)."""
    cfg = read_options(options_file)
    model = ELMo(cfg)
    model.load_state_dict(read_weights(weight_file, cfg), strict=True)
    return model.eval()
