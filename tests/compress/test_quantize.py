"""int8 quantisation: per-channel scales, every kernel within the error bound of its scheme, save /
load identical, truncated files and training refused, embeddings close to fp32, and quantised
models through `lmforge quantize`, embed, fill-mask, generate and evaluate."""
import json

import pytest
import torch
from torch import nn

import lmforge
from lmforge.cli import main
from lmforge.compress.quantize import parameter_count, quantize
from lmforge.config import ConfigError
from lmforge.heads import attach
from lmforge.io import CheckpointError
from lmforge.quant.engines import ENGINES, QUANTISING
from lmforge.quant.int8 import CHOICES, SERIAL, Int8Linear, quantise_per_channel, vnni_in_use
from tests.conftest import tiny_model
from tests.tasks.core import sentiment, tiny, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny matrices, a busy second core


def test_per_channel_scales_on_a_hand_example():
    w = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [127.0, 0.0, -63.5]])
    q, scale = quantise_per_channel(w)
    torch.testing.assert_close(scale, torch.tensor([2 / 127, 1.0, 1.0]))
    # 0.5 / (2 / 127) = 31.75 -> 32; round half to even: 63.5 -> 64, -63.5 -> -64;
    # the row's largest |w| maps to +-127
    assert q.tolist() == [[64, -127, 32], [0, 0, 0], [127, 0, -64]]
    assert q.dtype == torch.int8


@pytest.mark.parametrize("mode", ["dynamic", "weight-only"])
def test_every_kernel_stays_within_its_quantisation_bound(mode):
    torch.manual_seed(0)
    linear = nn.Linear(96, 40)
    module = Int8Linear.from_linear(linear, mode)
    x = torch.randn(37, 96) * 3
    with torch.no_grad():
        exact = linear(x)
        # |x (W - Wq)^T| <= |x| (scale / 2); dynamic adds |Wq| (|x|max_row / 127): 7-bit rows over +-|x|max
        bound = x.abs() @ (module.scale / 2).expand(96, 40)
        if mode == "dynamic":
            bound += (x.abs().amax(1, keepdim=True) / 127) * module.weight.abs().sum(1)
        # bf16 rounds each x_i and the row sum, each within 2^-9 relative: |x| |Wq|^T 2^-8 more
        rounding = {"int8pack-bf16": (x.abs() @ module.weight.abs().T) * 2.0 ** -8}
        assert mode == "dynamic" or "int8pack-bf16" in module.candidates()  # 96 columns: a multiple of 16
        for kernel in module.candidates():
            error = (module.run(kernel, x) - exact).abs()
            assert (error <= (bound + rounding.get(kernel.removesuffix("-serial"), 0))
                    * 1.05 + 1e-4).all(), kernel
        assert (module(x) - exact).abs().max() <= ((bound + rounding["int8pack-bf16"]) * 1.05 + 1e-4).max()


def test_eight_bit_activations_only_where_the_kernels_run_vnni():
    flags = "fpu sse avx2 avx512f avx512_vnni"
    assert vnni_in_use(flags, {}) and vnni_in_use("avx2 avx512f amx_int8", {})
    assert not vnni_in_use("fpu sse avx2 avx512f", {})  # AVX-512 without VNNI sums pairs in int16
    assert not vnni_in_use("avx2 avx_vnni", {})  # fbgemm has no AVX-VNNI code
    assert not vnni_in_use(flags, {"ONEDNN_MAX_CPU_ISA": "AVX2"})  # an AVX2 CPU emulated
    assert not vnni_in_use(flags, {"FBGEMM_ENABLE_INSTRUCTIONS": "avx512"})
    assert not vnni_in_use(flags, {"DNNL_MAX_CPU_ISA": "AVX2"})  # oneDNN's older name for its cap
    assert not vnni_in_use(flags, {"ONEDNN_MAX_CPU_ISA": "AVX2_VNNI"})  # needs avx_vnni, which flags lacks
    assert not vnni_in_use(flags, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"})  # AVX-512 before VNNI
    assert vnni_in_use(flags, {"ONEDNN_MAX_CPU_ISA": "DEFAULT", "FBGEMM_ENABLE_INSTRUCTIONS": ""})
    kept = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512_E1"}
    assert vnni_in_use(flags, kept)


def test_the_bf16_kernel_is_offered_only_where_its_aligned_loads_fit():
    # it reads 16 columns at a time with aligned loads: 100 columns would read past each row
    assert "int8pack-bf16" not in Int8Linear.from_linear(nn.Linear(100, 8), "weight-only").candidates()
    assert "int8pack-bf16" in Int8Linear.from_linear(nn.Linear(112, 8), "weight-only").candidates()


@pytest.mark.parametrize("smoothed", [False, True])
def test_a_large_input_scaled_into_the_reused_buffer_gives_the_same_output(monkeypatch, smoothed):
    import lmforge.quant.int8 as int8

    torch.manual_seed(0)
    smooth = torch.rand(64) + 0.5 if smoothed else None
    module = Int8Linear.from_linear(nn.Linear(64, 48), "dynamic", smooth=smooth)
    x = torch.randn(30, 64)
    before = x.clone()
    kernels = [k for k in module.candidates() if k.removesuffix("-serial") in ENGINES]
    if not kernels:
        pytest.skip("this torch build has no quantized engine")
    with torch.no_grad():
        for kernel in kernels:
            fresh = module.run(kernel, x)
            monkeypatch.setattr(int8, "SCRATCH_MIN_BYTES", 0)  # every input "large": the buffer path
            reused = [module.run(kernel, x), module.run(kernel, x * 2)]  # the buffer's second use
            monkeypatch.setattr(int8, "SCRATCH_MIN_BYTES", 1 << 62)
            assert torch.equal(reused[0], fresh) and torch.equal(reused[1], module.run(kernel, x * 2)), kernel
    assert torch.equal(x, before)  # the caller's input is divided into another tensor, never in place


def test_a_kernel_chosen_on_a_contiguous_input_takes_a_transposed_one():
    # the choice is per shape, not per layout: int8pack's op refuses an x whose last dimension is strided
    module = Int8Linear.from_linear(nn.Linear(64, 24), "weight-only")
    x = torch.randn(64, 5)
    with torch.no_grad():
        for kernel in module.candidates():
            expected = module.run(kernel, x.T.contiguous())
            torch.testing.assert_close(module.run(kernel, x.T), expected, rtol=0, atol=0, msg=kernel)


def test_a_kernel_that_disagrees_with_fp32_is_never_chosen(monkeypatch):
    module = Int8Linear.from_linear(nn.Linear(64, 20), "weight-only")
    run = Int8Linear.run
    broken = {"int8pack-bf16": float("nan"), "dequantise": 5.0}  # one not finite, one far off
    monkeypatch.setattr(Int8Linear, "candidates", lambda self, bucket=1: ["fp32", *broken])
    monkeypatch.setattr(Int8Linear, "run", lambda self, k, x: run(self, k, x) + broken.get(k, 0.0))
    with torch.no_grad():
        module(torch.randn(5, 64))
    from lmforge.quant.int8 import TIMINGS
    key = next(k for k in CHOICES if k[:3] == ("weight-only", 64, 20))
    assert CHOICES[key] == "fp32" and set(TIMINGS[key]) == {"fp32"}


def test_a_shape_measures_once_and_never_keeps_a_slower_kernel_than_fp32():
    module = Int8Linear.from_linear(nn.Linear(24, 12), "dynamic")
    with torch.no_grad():
        module(torch.randn(3, 24))
    key = next(k for k in CHOICES if k[1:3] == (24, 12))
    from lmforge.quant.int8 import TIMINGS
    assert "fp32" in TIMINGS[key] and TIMINGS[key][CHOICES[key]] == min(TIMINGS[key].values())


def test_threads_meeting_a_new_shape_together_measure_it_once(monkeypatch):
    import threading
    import time

    module = Int8Linear.from_linear(nn.Linear(40, 8), "dynamic")
    calls, barrier = [], threading.Barrier(4)
    measure = Int8Linear._measure

    def counted(self, key, x):
        calls.append(key)
        time.sleep(0.05)  # a measurement takes a while: the other threads arrive meanwhile
        return measure(self, key, x)

    monkeypatch.setattr(Int8Linear, "_measure", counted)

    def forward():
        barrier.wait()
        with torch.no_grad():
            module(torch.randn(5, 40))

    threads = [threading.Thread(target=forward) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(calls) == len(set(calls)) == 1  # the others waited for the one choice


def test_a_form_another_threads_measurement_drops_meanwhile_does_not_fail_the_call():
    # two server workers: one's _measure drops the forms it did not choose while the other reads one
    module = Int8Linear.from_linear(nn.Linear(24, 12), "weight-only")
    x = torch.randn(3, 24)
    with torch.no_grad():
        expected = module.run("fp32", x)

        class Racing(dict):  # the other thread pops the form right after this one looked it up
            def __contains__(self, kernel):
                return bool(self.get(kernel))

            def get(self, kernel, default=None):
                form = super().get(kernel, default)
                self.pop(kernel, None)
                return form

        module._derived = Racing(module._derived)
        torch.testing.assert_close(module.run("fp32", x), expected, rtol=0, atol=0)


def _lm_model(preset="bert-base"):
    model = tiny_model(preset)
    attach(model, "lm")
    return model.eval()


@pytest.mark.parametrize("mode", ["dynamic", "weight-only", "dynamic unsmoothed"])
def test_save_and_load_give_identical_outputs(tmp_path, mode):
    mode, *unsmoothed = mode.split()
    model = quantize(_lm_model(), mode, alpha=None if unsmoothed else 0.75)
    ids = torch.randint(5, 99, (2, 12), generator=torch.Generator().manual_seed(0))
    model.save(tmp_path)
    again = lmforge.load(tmp_path).eval()
    assert again.config.quantization["mode"] == mode
    assert sum(isinstance(m, Int8Linear) for m in again.modules()) == sum(
        isinstance(m, Int8Linear) for m in model.modules()) > 0
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    assert parameter_count(again) == parameter_count(_lm_model())
    with torch.inference_mode():  # buffers without version counters
        assert torch.equal(lmforge.load(tmp_path).eval()(ids).logits, again(ids).logits)


def test_an_encoder_token_table_is_int8_and_reloads(tmp_path):
    model = tiny_model("bert-base")  # no LM head reads its token table
    q = quantize(model)
    assert q.config.quantization["tokens"] and type(q.tokens).__name__ == "Int8Embedding"
    ids = torch.randint(5, 99, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(q.tokens(ids), model.tokens(ids), atol=float(q.tokens.scale.max()) / 2, rtol=0)
    q.save(tmp_path)
    with torch.no_grad():
        assert torch.equal(lmforge.load(tmp_path).eval()(ids).last_hidden_state, q(ids).last_hidden_state)
    assert parameter_count(q) == parameter_count(model)
    assert not quantize(_lm_model()).config.quantization["tokens"]  # a tied LM head projects with it


def test_truncated_file_is_refused(tmp_path):
    quantize(_lm_model()).save(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        lmforge.load(tmp_path)


def test_training_and_hf_export_are_refused(tmp_path):
    from lmforge.objectives import MaskedLM
    from lmforge.train import Trainer
    from tests.train.helpers import quick, toy_data

    model = quantize(_lm_model())
    with pytest.raises(ValueError, match="training it is refused"):
        Trainer(MaskedLM(model, mask_id=3, special_ids=(1, 2)), toy_data(), quick(), tmp_path / "run")
    with pytest.raises(ValueError, match="int8-quantised"):
        model.save(tmp_path / "hf", format="hf")


def test_the_config_field_is_checked():
    with pytest.raises(ConfigError, match="^quantization mode 'int4' is not dynamic or weight-only$"):
        lmforge.tiny("bert-base").replace(quantization={"mode": "int4", "kept_fp32": ["x" * 200]})
    cut = r"'x{19} \.\.\. \(162 characters left out\) \.\.\. x{19}'$"
    with pytest.raises(ConfigError, match=r"^quantization must be a mapping, got " + cut):
        lmforge.tiny("bert-base").replace(quantization="x" * 200)  # long values cut: head, count, tail
    with pytest.raises(ValueError, match="already int8"):
        quantize(quantize(_lm_model()))


def test_embeddings_stay_close_to_fp32():
    torch.manual_seed(0)
    model = lmforge.build("bert-base", n_layers=2, d_model=128, n_heads=4, d_ff=512, vocab_size=400).eval()
    ids = torch.randint(5, 400, (8, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = model(ids).last_hidden_state.mean(1)
        for mode in ("dynamic", "weight-only"):
            b = quantize(model, mode)(ids).last_hidden_state.mean(1)
            assert torch.nn.functional.cosine_similarity(a, b).min() >= 0.99, mode


def test_generation_runs_quantised_and_leaves_the_model_quantised():
    model = _lm_model("gpt2")
    prompt = torch.randint(5, 99, (1, 6), generator=torch.Generator().manual_seed(0))
    for mode in ("dynamic", "weight-only"):
        q = quantize(model, mode)
        out = lmforge.generate(q, prompt, max_new_tokens=5)
        assert out.shape == (1, 11) and torch.equal(out[:, :6], prompt)
        assert sum(isinstance(m, Int8Linear) for m in q.modules()) > 0


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
    """(directory, splits): a tiny BERT fine-tuned a few steps on the sentiment task, with task.json."""
    from lmforge.tasks.finetune import finetune
    from lmforge.train import TrainConfig

    out, data = tmp_path_factory.mktemp("sst"), sentiment(100)
    finetune(tiny("bert-base", n_layers=2, n_heads=4), tokenizer(), "cls", data["train"], None, out,
             TrainConfig(steps=4, batch_size=8, lr=3e-3, seed=0, log_every=100, progress=False),
             log=lambda *a: None)
    return out / "final", data


def test_a_fine_tuned_model_is_timed_in_eval_mode_on_the_cpu(fine_tuned):
    from lmforge.compress.quantize_report import _models

    path, data = fine_tuned
    _, fp32, _, int8 = _models(path, data["validation"], None)
    assert not fp32.training and not int8.training  # dropout would slow both and blur the ratio
    assert all(p.device.type == "cpu" for p in (*fp32.parameters(), *int8.parameters()))


def test_quantize_command_reports_and_the_model_evaluates(fine_tuned, tmp_path, capsys):
    path, data = fine_tuned
    dev = tmp_path / "dev.jsonl"
    dev.write_text("".join(json.dumps(r) + "\n" for r in data["validation"]))
    assert main(["quantize", "--model", str(path), "--out", str(tmp_path / "q"), "--data", str(dev),
                 "--batch-size", "2", "--seq-len", "16", "--rounds", "1"]) == 0
    report = json.loads((tmp_path / "q" / "quantize.json").read_text())
    # what the accuracy rests on, said: the activations' bits wherever a kernel quantises them (on a busy
    # machine every layer may measure its fp32 form fastest, and then none is quantised: None)
    quantising = [k for k in report["kernels"] if k["kernel"].removesuffix(SERIAL) in QUANTISING] + \
        [r for r in report["ffn_routes"] if r["route"] == "fused"]  # hidden units quantised in one pass
    assert report["activation_bits"] in ((7, 8) if quantising else (None,))
    assert report["kernels"]  # the int8 layers were timed on their kernels, not on the autograd fallback
    assert report["after"]["bytes"] < report["before"]["bytes"]  # embeddings (most of a tiny model) stay fp32
    assert report["after"]["parameters"] == report["before"]["parameters"] and \
        report["after"]["int8_layers"] > 0
    assert abs(report["after"]["metric"] - report["before"]["metric"]) <= 0.05
    assert "speed-up" in capsys.readouterr().out
    assert main(["evaluate", "--model", str(tmp_path / "q" / "model"), "--data", str(dev)]) == 0


def test_fill_mask_embed_and_generate_commands_take_a_quantised_model(tmp_path):
    for preset, family in (("bert-base", "bert"), ("gpt2", "gpt2")):
        model = tiny(preset)
        attach(model, "lm")
        model.save(tmp_path / preset)
        tokenizer(family).save(tmp_path / preset)
        assert main(["quantize", "--model", str(tmp_path / preset), "--out", str(tmp_path / f"q-{preset}"),
                     "--batch-size", "1", "--seq-len", "8", "--rounds", "1"]) == 0
    bert, gpt = tmp_path / "q-bert-base" / "model", tmp_path / "q-gpt2" / "model"
    assert main(["fill-mask", "a good [MASK] .", "--model", str(bert), "--top-k", "2"]) == 0
    assert main(["embed", "a good film", "--model", str(bert)]) == 0
    assert main(["generate", "a good", "--model", str(gpt), "--max-new-tokens", "3"]) == 0


def test_bad_input_is_one_line_and_status_2(tmp_path, capsys):
    assert main(["quantize", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert main(["quantize", "--model", "bert-base", "--out", str(tmp_path / "o")]) == 2
    with pytest.raises(SystemExit, match="2"):  # a count out of its bounds: argparse's one line
        main(["quantize", "--model", str(tmp_path), "--out", str(tmp_path / "o"), "--rounds", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("lmforge quantize: error:") for line in err)
    assert "--rounds 0: must be in [1, 1000]" in err[2]


def test_the_server_serves_quantised_models(tmp_path):
    from fastapi.testclient import TestClient

    from lmforge.serve.app import create_app
    from lmforge.serve.models import load_served

    for preset, family in (("bert-base", "bert"), ("gpt2", "gpt2")):
        model = tiny(preset)
        attach(model, "lm")
        quantize(model).save(tmp_path / preset)
        tokenizer(family).save(tmp_path / preset)
    app = create_app({"b": load_served("b", tmp_path / "bert-base"),
                      "g": load_served("g", tmp_path / "gpt2")})
    with TestClient(app) as client:
        assert len(client.post("/embed",
                               json={"texts": ["a good film"], "model": "b"}).json()["embeddings"]) == 1
        assert client.post("/fill_mask",
                           json={"text": "a good [MASK] .", "model": "b", "top_k": 2}).status_code == 200
        reply = client.post("/generate", json={"prompt": "a good", "model": "g", "max_new_tokens": 3}).json()
        assert len(reply["token_ids"]) == 3


def test_sentence_transformers_files_travel_with_the_quantised_model(tmp_path):
    from lmforge.compress.model_files import carry_sentence_files

    source, dest = tmp_path / "st", tmp_path / "q"
    (source / "1_Pooling").mkdir(parents=True)
    dest.mkdir()
    (source / "modules.json").write_text("[]")
    (source / "sentence_bert_config.json").write_text('{"max_seq_length": 256}')
    (source / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    carry_sentence_files(source, dest)
    assert json.loads((dest / "sentence_bert_config.json").read_text())["max_seq_length"] == 256
    assert (dest / "modules.json").is_file() and (dest / "1_Pooling" / "config.json").is_file()


def test_the_python_call_accepts_and_refuses_as_the_command_s_options_do():
    """quantize() checks mode, alpha and seed by QuantizeOptions, the flags' own object: True was read as
    alpha 1.0, a bool or numpy seed failed inside the calibration, a folder's name or texts as calibration
    failed with AttributeErrors; now one OptionsError naming the argument, and numpy numbers are read as
    the Python numbers they are."""
    import numpy as np

    from lmforge.config.options import OptionsError

    model = lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=50)
    refused = {"alpha": dict(alpha=True), "seed": dict(seed=True), "mode": dict(mode="int4"),
               "calibration": dict(calibration=["a text"])}
    with pytest.raises(OptionsError, match="got an empty list$"):  # [] calibrated on random tokens, unsaid
        quantize(model, calibration=[])
    for field, kwargs in refused.items():
        with pytest.raises(OptionsError) as err:
            quantize(model, **kwargs)
        assert err.value.field == field and "\n" not in str(err.value), kwargs
    with pytest.raises(OptionsError, match="^alpha=0.3: smoothing is for mode dynamic") as err:
        quantize(model, mode="weight-only", alpha=0.3)
    with pytest.raises(OptionsError, match=r"^model must be a model \(lmforge.load\(DIR\) reads one\)"):
        quantize("a-folder")
    same = [quantize(model, seed=seed).state_dict() for seed in (1, np.int64(1))]
    assert all(torch.equal(same[0][k], same[1][k]) for k in same[0])


def test_a_non_finite_token_table_is_refused_before_any_layer_is_swapped():
    """NaN only in the token table, in place: the Linears had been swapped when the token table refused."""
    model = tiny("bert-base", n_layers=1)
    with torch.no_grad():
        model.tokens.weight[3, 0] = float("nan")
    with pytest.raises(ValueError, match="tokens.weight holds non-finite"):
        quantize(model, inplace=True, alpha=None)
    assert not any(isinstance(m, Int8Linear) for m in model.modules()) and not model.config.quantization
