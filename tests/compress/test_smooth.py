"""SmoothQuant before dynamic int8: the factors on a hand example, the smoothed product still x W^T,
outlier channels losing less, calibration that leaves the model as it was, and the choice recorded,
saved, reloaded, checked and reported by `lmforge quantize`."""
import json

import pytest
import torch
from torch import nn

import lmforge
from lmforge.cli import main
from lmforge.compress.quantize import quantize
from lmforge.compress.smooth import (SPREAD, factors, input_ranges, layer_norm_readers, random_batches,
                                     smoothing, text_batches)
from lmforge.config import ConfigError
from lmforge.io import CheckpointError
from lmforge.quant import int8
from lmforge.quant.engines import ENGINES, engine_usable
from lmforge.quant.int8 import Int8Linear
from tests.conftest import tiny_model
from tests.tasks.core import tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_factors_on_a_hand_example():
    x_max, weight = torch.tensor([4.0, 1.0, 0.0]), torch.tensor([[1.0, -4.0, 2.0], [0.5, 2.0, -1.0]])
    s = factors(x_max, weight, alpha=0.5)  # sqrt(x_max / w_max): w_max = [1, 4, 2]
    torch.testing.assert_close(s[:2], torch.tensor([2.0, 0.5]))
    # at alpha 0.5 the smoothed input and weight columns reach the same range
    torch.testing.assert_close((x_max / s)[:2], (weight.abs().amax(0) * s)[:2])
    assert s[2] == s[:2].median()  # a channel that never fired keeps the typical factor
    torch.testing.assert_close(factors(x_max, weight, alpha=1.0)[:2], x_max[:2])
    with pytest.raises(ValueError, match="alpha"):
        factors(x_max, weight, alpha=1.5)


def test_factors_stay_within_their_spread_of_the_median():
    x_max = torch.tensor([1.0, 1.0, 1.0, 1e6, 1e-4])
    s = factors(x_max, torch.ones(3, 5), alpha=1.0)
    torch.testing.assert_close(s, torch.tensor([1.0, 1.0, 1.0, SPREAD, 1 / SPREAD]))


def test_a_channel_quiet_in_calibration_still_counts_when_it_fires():
    torch.manual_seed(0)
    linear, calibration = nn.Linear(96, 40), _outlier_input()
    calibration[:, 5] = 0.0  # never fired while the factors were measured
    s = factors(calibration.abs().amax(0), linear.weight, alpha=0.75)
    module = Int8Linear.from_linear(linear, "dynamic", smooth=s)
    x = _outlier_input()
    x[:, 5] = 3.0  # it fires now
    with torch.no_grad():
        exact = linear(x)
        for kernel in module.candidates():
            assert (module.run(kernel, x) - exact).norm() <= 0.05 * exact.norm(), kernel


def _outlier_input(rows: int = 64, features: int = 96) -> torch.Tensor:
    x = torch.randn(rows, features, generator=torch.Generator().manual_seed(0))
    x[:, :3] *= 60  # a LayerNorm's outlier channels: they set each row's quantisation step
    return x


def test_a_smoothed_layer_computes_x_w_and_loses_less_on_outlier_channels():
    torch.manual_seed(0)
    linear, x = nn.Linear(96, 40), _outlier_input()
    s = factors(x.abs().amax(0), linear.weight, alpha=0.75)
    plain = Int8Linear.from_linear(linear, "dynamic")
    smoothed = Int8Linear.from_linear(linear, "dynamic", smooth=s)
    with torch.no_grad():
        exact = linear(x)
        step = float(smoothed.scale.max() / s.min())  # one int8 step of W s, divided back by s
        torch.testing.assert_close(smoothed.weight, linear.weight, atol=step, rtol=0)
        kernels = [k for k in plain.candidates() if k.removesuffix("-serial") in ENGINES]
        if not kernels:
            pytest.skip("no quantized engine in this torch build")
        for kernel in kernels:
            errors = [(m.run(kernel, x) - exact).norm() / exact.norm() for m in (plain, smoothed)]
            assert errors[1] < errors[0] / 2, (kernel, errors)
    with pytest.raises(ValueError, match="weight-only"):
        Int8Linear.from_linear(linear, "weight-only", smooth=s)
    for bad in (s[:10], -s, s * float("nan"), True):
        with pytest.raises(ValueError, match="smooth"):
            Int8Linear.from_linear(linear, "dynamic", smooth=bad)
    with pytest.raises(ValueError, match="smooth"):
        Int8Linear.from_linear(linear, "dynamic", quantise=False, smooth=s)  # factors, nothing to apply to


def test_calibration_records_each_readers_input_range_and_leaves_the_model_as_it_was():
    model = tiny_model("bert-base").train()
    names = layer_norm_readers(model)
    assert names and all(n.endswith((".qkv", ".up")) for n in names)
    batches = random_batches(model)
    hooks_before = sum(len(m._forward_pre_hooks) for m in model.modules())
    seen = {}
    hook = model.encoder.blocks[0].attn.qkv.register_forward_pre_hook(
        lambda m, args: seen.setdefault("x", []).append(args[0].detach().reshape(-1, m.in_features)))
    ranges = input_ranges(model, batches, names)
    hook.remove()
    torch.testing.assert_close(ranges[names[0]], torch.cat(seen["x"]).abs().amax(0))
    assert model.training  # the mode is restored, and no hook is left behind
    assert sum(len(m._forward_pre_hooks) for m in model.modules()) == hooks_before


def _with_outliers() -> nn.Module:
    """A tiny BERT (the test tokenizer's vocabulary) shaped as trained ones are: its LayerNorms scale
    two channels 40x, and the Linears reading them give those channels weights 40x smaller (so every
    channel carries signal)."""
    model = tiny_model("bert-base", vocab_size=tokenizer().vocab_size).eval()
    modules = dict(model.named_modules())
    with torch.no_grad():
        for norm in model.modules():
            if isinstance(norm, nn.LayerNorm):
                norm.weight[:2] = 40.0
        for name in layer_norm_readers(model):
            modules[name].weight[:, :2] /= 40.0
    return model


class _Always(dict):
    """A CHOICES table that answers one kernel for every shape (tiny shapes would measure fp32 fastest)."""

    def __init__(self, kernel: str) -> None:
        super().__init__()
        self.kernel = kernel

    def get(self, key, default=None):
        return self.kernel


def test_every_smoothed_layer_loses_less_on_the_inputs_the_model_gives_it(monkeypatch):
    engine = next((e for e in ENGINES if engine_usable(e)), None)
    if engine is None:
        pytest.skip("no quantized engine in this torch build")
    monkeypatch.setattr(int8, "CHOICES", _Always(engine))  # the int8 product itself, at every shape
    model = _with_outliers()
    names, modules = layer_norm_readers(model), dict(model.named_modules())
    inputs = {}

    def keep(name):
        def hook(module, args):  # returns None: the input goes on unchanged
            inputs[name] = args[0].detach().reshape(-1, module.in_features)
        return hook

    hooks = [modules[name].register_forward_pre_hook(keep(name)) for name in names]
    ids = torch.randint(5, 99, (8, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids)
        for hook in hooks:
            hook.remove()
        int8_models = {alpha: dict(quantize(model, alpha=alpha).named_modules()) for alpha in (None, 0.75)}
        for name in names:
            exact = modules[name](inputs[name])
            error = {alpha: float((layers[name](inputs[name]) - exact).norm() / exact.norm())
                     for alpha, layers in int8_models.items()}
            assert error[0.75] < error[None] / 4, (name, error)  # here 0.3 -> 0.007 in the FFN's first layer


def test_the_choice_is_recorded_and_reloads_with_identical_outputs(tmp_path):
    model = _with_outliers()
    texts = ["a good film", "a dull plot and a bad ending", "fine"]
    q = quantize(model, calibration=text_batches(model, tokenizer(), texts), source="three reviews")
    record = q.config.quantization["smoothing"]
    assert record["calibration"] == "three reviews" and record["alpha"] == 0.75
    assert record["layers"] == sorted(layer_norm_readers(model))
    q.save(tmp_path)
    again = lmforge.load(tmp_path).eval()
    layers = [m for m in again.modules() if isinstance(m, Int8Linear)]
    assert sum(m.smooth is not None for m in layers) == len(record["layers"])
    ids = torch.randint(5, 99, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(again(ids).last_hidden_state, q(ids).last_hidden_state)
    assert "smoothing" not in quantize(model, alpha=None).config.quantization
    assert "smoothing" not in quantize(model, "weight-only").config.quantization
    for bad in ({"mode": "weight-only", "calibration": random_batches(model)},
                {"alpha": None, "calibration": random_batches(model)}, {"alpha": 2.0}):
        with pytest.raises(ValueError, match="calibration|alpha"):
            quantize(model, **bad)
    assert smoothing(model, random_batches(model), names=["encoder.blocks.0.attn.out"]).keys() == {
        "encoder.blocks.0.attn.out"}


def test_the_config_field_is_checked(tmp_path):
    cfg = lmforge.tiny("bert-base")
    for bad in ({"mode": "weight-only", "smoothing": {"layers": ["a.qkv"]}},
                {"mode": "dynamic", "smoothing": {"layers": "a.qkv"}},
                {"mode": "dynamic", "smoothing": "on"}):
        with pytest.raises(ConfigError, match="smoothing"):
            cfg.replace(quantization=bad)
    quantize(tiny_model("bert-base")).save(tmp_path)
    config = tmp_path / "config.json"
    meta = json.loads(config.read_text())
    layers = meta["config"]["quantization"]["smoothing"]["layers"]
    meta["config"]["quantization"]["smoothing"]["layers"] = [*layers, "encoder.blocks.9.attn.qkv"]
    config.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="blocks.9.attn.qkv"):
        lmforge.load(tmp_path)
    meta["config"]["quantization"]["smoothing"] = None  # read as unsmoothed: the weights' factors refuse
    config.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError):
        lmforge.load(tmp_path)


def test_quantize_command_calibrates_on_a_file_and_refuses_bad_options(tmp_path, capsys):
    model = tiny_model("bert-base", vocab_size=tokenizer().vocab_size)
    model.save(tmp_path / "m")
    tokenizer().save(tmp_path / "m")
    (tmp_path / "calib.txt").write_text("a good film\n\nthe plot was dull\n")
    (tmp_path / "empty.txt").write_text("\n \n")
    base = ["quantize", "--model", str(tmp_path / "m"), "--rounds", "1", "--seq-len", "16"]
    assert main([*base, "--out", str(tmp_path / "q"), "--calibration", str(tmp_path / "calib.txt")]) == 0
    report = json.loads((tmp_path / "q" / "quantize.json").read_text())
    assert report["smoothing"]["calibration"] == "text" and report["smoothing"]["calibration_texts"] == 2
    assert "layers smoothed" in capsys.readouterr().out
    assert main([*base, "--out", str(tmp_path / "n"), "--no-smooth"]) == 0
    assert "smoothing" not in json.loads((tmp_path / "n" / "quantize.json").read_text())
    capsys.readouterr()
    for bad in (["--calibration", str(tmp_path / "missing.txt")],
                ["--calibration", str(tmp_path / "empty.txt")], ["--smooth-alpha", "1.5"],
                ["--mode", "weight-only", "--smooth-alpha", "0.5"], ["--no-smooth", "--smooth-alpha", "0.5"]):
        assert main([*base, "--out", str(tmp_path / "x"), *bad]) == 2
    model.save(tmp_path / "bare")  # no tokenizer to read the calibration text with
    assert main(["quantize", "--model", str(tmp_path / "bare"), "--out", str(tmp_path / "x"),
                 "--calibration", str(tmp_path / "calib.txt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 6 and all(line.startswith("lmforge quantize: error:") for line in err), err
    assert "missing.txt" in err[0] and "empty.txt" in err[1] and "--smooth-alpha" in err[2]
    assert "--smooth-alpha 0.5: smoothing is for mode dynamic" in err[3] and "--no-smooth" in err[4]
    assert "--calibration needs" in err[5]


ARCHITECTURES = ["t5-small", "llama-3.2-1b", "albert-base", "longformer-base", "xlnet-base"]


@pytest.mark.parametrize("preset", ARCHITECTURES)
def test_every_architecture_calibrates_smooths_and_reloads_identically(preset, tmp_path):
    model = tiny_model(preset)
    q = quantize(model)
    smoothed = q.config.quantization["smoothing"]["layers"]
    assert smoothed == sorted(layer_norm_readers(model))  # calibration reached every reader
    q.save(tmp_path)
    again = lmforge.load(tmp_path).eval()
    ids = torch.randint(5, 90, (2, 10), generator=torch.Generator().manual_seed(0))
    extra = {"decoder_input_ids": ids} if model.config.architecture == "encoder-decoder" else {}
    with torch.no_grad():
        assert torch.equal(again(ids, **extra, run_heads=False).last_hidden_state,
                           q(ids, **extra, run_heads=False).last_hidden_state)


def test_a_huge_text_is_tokenised_only_as_far_as_its_calibrated_tokens_reach(monkeypatch):
    """A 15 MB line was tokenised whole (3 GB, 15 s) for its first 128 tokens."""
    from lmforge.compress.smooth import TOKEN_CHARS

    model, tok = tiny_model("bert-base", vocab_size=tokenizer().vocab_size), tokenizer()
    seen, encode = [], type(tok).encode_batch
    monkeypatch.setattr(type(tok), "encode_batch", lambda self, texts, **kw: seen.append(
        max(map(len, texts))) or encode(self, texts, **kw))
    huge = text_batches(model, tok, ["a good film " * 100_000], max_length=16)
    short = text_batches(model, tok, ["a good film " * 10], max_length=16)
    assert seen[0] <= 16 * TOKEN_CHARS  # what tokens 16 can reach, no more
    assert torch.equal(huge[0]["input_ids"], short[0]["input_ids"])  # the same first tokens
