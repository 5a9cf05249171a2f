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
