"""lmforge.io.folder_config: a model folder's ModelConfig from its config.json alone, no weight read, as
lmforge.load builds it (lmforge's format or Hugging Face's); what load refuses first (a FIFO among its
files) it refuses too, without waiting on it. teacher_config and the command line's config files read
through it."""
import json
import os

import pytest

import lmforge
from lmforge.io import CheckpointError, folder_config
from tests.fifo import hf_folder_with_fifo, not_waiting

SHAPE = {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64, "vocab_size": 100}


def _unreadable(*args, **kwargs):
    raise AssertionError("folder_config read the weights")


def test_an_lmforge_folder_s_config_is_the_loaded_model_s_without_its_weights(tmp_path, monkeypatch):
    model = lmforge.build("albert-base", **SHAPE)
    model.save(tmp_path / "m")
    loaded = lmforge.load(tmp_path / "m").config
    monkeypatch.setattr("lmforge.io.native.load_weights", _unreadable)
    (tmp_path / "m" / "model.safetensors").unlink()  # no weight is needed
    cfg = folder_config(tmp_path / "m")
    assert cfg == loaded == model.config and cfg.share_layers


def test_a_hugging_face_folder_s_config_is_read_with_its_forced_tokens(tmp_path):
    lmforge.build("bart-base", **SHAPE).save(tmp_path / "h", format="hf")
    for name in os.listdir(tmp_path / "h"):
        if name.endswith((".safetensors", ".bin")):
            os.remove(tmp_path / "h" / name)  # no weight is needed
    (tmp_path / "h" / "generation_config.json").write_text(json.dumps({"forced_bos_token_id": 7}))
    cfg = folder_config(str(tmp_path / "h"))
    assert cfg.architecture == "encoder-decoder" and cfg.d_model == 32 and cfg.n_layers == 2
    assert cfg.forced_bos_token_id == 7


def test_a_config_that_builds_no_model_is_a_checkpoint_error_naming_the_file(tmp_path):
    lmforge.build("bert-base", **SHAPE).save(tmp_path / "h", format="hf")
    (tmp_path / "h" / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32}))
    with pytest.raises(CheckpointError, match=r"h/config.json: config.json of bert lacks the field"):
        folder_config(tmp_path / "h")
    (tmp_path / "h" / "config.json").write_text(json.dumps({"hidden_size": 32}))
    with pytest.raises(CheckpointError, match="is neither an lmforge model directory"):
        folder_config(tmp_path / "h")


def test_a_fifo_in_the_folder_is_refused_naming_it_not_waited_on(tmp_path):
    """A FIFO generation_config.json blocks its reader forever: refused first, as load refuses it (an alarm
    ends the wait, failing the test)."""
    folder = hf_folder_with_fifo(tmp_path / "t", **SHAPE)
    with not_waiting(), pytest.raises(CheckpointError,
                                      match=r"generation_config.json is not a regular file \(a named"):
        folder_config(folder)
