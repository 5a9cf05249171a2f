"""Reading a weights file: a failure is told by its real cause, in one line naming the file."""
import pytest

import lmforge
from lmforge.io import CheckpointError


def test_unreadable_weights_are_said_to_be_unreadable_not_missing(tmp_path, monkeypatch):
    lmforge.build(lmforge.tiny("bert-base")).save(tmp_path)
    real_open = open

    def denied(file, *args, **kwargs):  # chmod 000 as a user without root's override (root reads anyway)
        if str(file).endswith("model.safetensors"):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", denied)
    monkeypatch.setattr("lmforge.io.files.load_file", lambda f: denied(f))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: Permission denied$"):
        lmforge.load(tmp_path)
