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


@pytest.mark.parametrize("tamper", ["float_qweight", "int32_qweight", "negative_scale", "qweight_minus_128"])
def test_a_tensor_of_another_kind_is_refused_not_cast(tmp_path, tamper):
    """With config.json's checksum dropped (an edit made on purpose), an int8 weight saved as float32 or
    int32 had been cast, wrapping into other numbers, and a negative scale loaded: outputs 0.1-9 off."""
    import json

    from safetensors.torch import load_file, save_file

    from lmforge.compress.quantize import quantize

    model = quantize(lmforge.build(lmforge.tiny("bert-base")).eval(), inplace=True)
    model.save(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    qweight = next(k for k in tensors if k.endswith("qweight"))
    if tamper == "float_qweight":
        tensors[qweight] = tensors[qweight].float() * 3.3
    elif tamper == "int32_qweight":
        tensors[qweight] = tensors[qweight].int() * 3
    elif tamper == "qweight_minus_128":  # quantisation writes [-127, 127] only
        tensors[qweight][0, 0] = -128
    else:
        tensors[qweight[:-len("qweight")] + "scale"][0] = -1.0
    save_file(tensors, tmp_path / "model.safetensors", {"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("sha256", None)
    config.pop("config_sha256", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    said = {"negative_scale": "is not positive", "qweight_minus_128": rf"{qweight} holds -128"}.get(
        tamper, "where the model holds torch.int8")
    with pytest.raises(CheckpointError, match=said) as err:
        lmforge.load(tmp_path)
    assert "model.safetensors" in str(err.value) and "\n" not in str(err.value)  # the file, one line
