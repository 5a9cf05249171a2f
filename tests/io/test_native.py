"""lmforge's model directory read on a hostile filesystem: every failure a CheckpointError naming the file."""
from pathlib import Path

import pytest

import lmforge
from lmforge.io import CheckpointError


def test_an_unreadable_config_json_is_a_checkpoint_error_naming_it(tmp_path, monkeypatch):
    lmforge.build(lmforge.tiny("bert-base")).save(tmp_path)
    real = Path.read_text

    def denied(self, *args, **kwargs):  # chmod 000 as a user without root's override
        if self.name == "config.json":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(CheckpointError, match=r"cannot read .*config\.json: Permission denied$"):
        lmforge.load(tmp_path)


@pytest.mark.parametrize("edit", [("norm_eps", 1e-13), ("ffn", "relu"), ("attention_scaling", False)])
def test_a_changed_config_value_that_still_builds_is_refused_not_loaded_as_another_model(tmp_path, edit):
    import json

    lmforge.build(lmforge.tiny("bert-base")).save(tmp_path)
    meta = json.loads((tmp_path / "config.json").read_text())
    meta["config"][edit[0]] = edit[1]  # a flipped digit or word: the weights still fit, the outputs differ
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"config\.json: its \"config\" or \"heads\" do not match"):
        lmforge.load(tmp_path)
    del meta["config_sha256"]  # an edit made on purpose, as the message says
    (tmp_path / "config.json").write_text(json.dumps(meta))
    assert getattr(lmforge.load(tmp_path).config, edit[0]) == edit[1]
