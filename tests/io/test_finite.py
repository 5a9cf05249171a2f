"""Loaded weights must be finite: a NaN or inf weight is refused at load, naming the file and tensor."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import lmforge
from lmforge.cli import main
from lmforge.io import CheckpointError
from lmforge.io.files import first_non_finite


@pytest.fixture
def saved(tmp_path):
    model = lmforge.build(lmforge.tiny("bert-base"))
    model.save(tmp_path / "m")
    return tmp_path / "m"


def unsigned(folder):
    """The folder as a hand-made one: config.json without the weights' checksum (an edit would not match)."""
    meta = json.loads((folder / "config.json").read_text())
    meta.pop("sha256")
    (folder / "config.json").write_text(json.dumps(meta))


def spoil(folder, value, count: int = 1):
    """Write `value` into the first element of the first `count` floating-point tensors (by name)."""
    file = folder / "model.safetensors"
    tensors = load_file(str(file))
    names = [k for k in sorted(tensors) if tensors[k].is_floating_point()][:count]
    for name in names:
        tensors[name].view(-1)[0] = value
    save_file(tensors, str(file), metadata={"format": "pt"})
    return file, names[0]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_weight_is_refused_naming_file_and_first_tensor(saved, value):
    file, first = spoil(saved, value, count=2)
    with pytest.raises(CheckpointError) as caught:
        lmforge.load(saved)
    message = str(caught.value)
    assert str(file) in message and first in message and "non-finite" in message and "\n" not in message


def test_finite_weights_whose_sum_overflows_still_load(saved):
    file = saved / "model.safetensors"
    tensors = load_file(str(file))
    name = next(k for k in sorted(tensors) if tensors[k].is_floating_point() and tensors[k].numel() > 2)
    tensors[name].view(-1)[:2] = 3e38  # finite, but their float32 sum is inf
    save_file(tensors, str(file), metadata={"format": "pt"})
    unsigned(saved)
    assert not torch.isfinite(tensors[name].sum())
    assert first_non_finite(tensors) is None
    assert lmforge.load(saved).state_dict()[name].view(-1)[0] == torch.tensor(3e38)


def test_integer_tensors_and_empty_ones_are_not_judged():
    assert first_non_finite({"ids": torch.arange(3), "empty": torch.empty(0), "w": torch.ones(2)}) is None
    assert first_non_finite({"b": torch.tensor([1.0, float("nan")]), "a": torch.ones(1)}) == "b"


def test_the_cli_refuses_nan_weights_with_exit_2_and_one_line(saved, capsys):
    file, first = spoil(saved, float("nan"))
    assert main(["inspect", str(saved)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and str(file) in err and first in err, err
    assert "Traceback" not in captured.err and not captured.out
