"""lmforge on a CUDA device gives what it gives on the CPU: every preset and axis case's outputs, greedy
tokens, a quantised model's outputs; a seeded training run on the GPU is bit-identical twice, resumes
exactly, and its checkpoint goes on training on the CPU. Skipped where torch sees no CUDA device (CI
has none): run on a GPU machine with `pytest tests/test_cuda.py`."""
import pytest
import torch

import lmforge
from lmforge.compress.quantize import quantize
from lmforge.generate import generate
from lmforge.heads import attach
from lmforge.train import Trainer
from lmforge.train.log import read_metrics
from tests.conftest import CASES, forward, tiny_model
from tests.train.helpers import clm_objective, interrupt_after, mlm_objective, quick, toy_data

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

GENERATIVE = [n for n, c in CASES.items() if c.architecture != "encoder" and c.architecture != "elmo"]


@pytest.fixture(autouse=True)
def full_fp32():
    """TF32 off, so the GPU's fp32 matmuls round as the CPU's do (TF32 keeps 10 mantissa bits)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _ids(model, b=2, t=12, seed=0):
    return torch.randint(3, model.config.vocab_size, (b, t), generator=torch.Generator().manual_seed(seed))


def _weights(model) -> dict:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", CASES)
def test_every_case_gives_the_cpus_outputs_on_cuda(name):
    model = tiny_model(CASES[name])
    attach(model, "lm")
    ids = _ids(model)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0  # a padded row: the masks travel too
    cpu = forward(model, ids, mask, return_hidden=True)
    gpu = forward(model.cuda(), ids.cuda(), mask.cuda(), return_hidden=True)
    assert gpu.logits.device.type == "cuda"
    torch.testing.assert_close(gpu.logits.cpu(), cpu.logits, atol=1e-4, rtol=1e-4)
    assert len(gpu.hidden_states) == len(cpu.hidden_states)
    for a, b in zip(gpu.hidden_states, cpu.hidden_states):
        torch.testing.assert_close(a.cpu(), b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", GENERATIVE)
def test_greedy_generation_on_cuda_gives_the_cpus_tokens(name):
    model = tiny_model(CASES[name])
    attach(model, "lm")
    ids = _ids(model, t=6)
    options = dict(max_new_tokens=10, eos_token_id=None, decoder_start_token_id=0)
    cpu = generate(model, ids, **options)
    gpu = generate(model.cuda(), ids.cuda(), **options)
    assert torch.equal(gpu.cpu(), cpu)


def test_a_seeded_run_on_cuda_is_bit_identical_twice(tmp_path):
    gpu = quick(steps=6, device="cuda")
    runs = [_weights(Trainer(mlm_objective(), toy_data(), gpu, tmp_path / out).fit()) for out in "ab"]
    assert _same(*runs)


def test_a_gpu_run_asks_cudnn_for_deterministic_algorithms(tmp_path):
    Trainer(mlm_objective(), toy_data(), quick(steps=1, device="cuda"), tmp_path)
    # convolutions (ELMo's character CNN) would otherwise sum their gradients in any order
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark


def test_a_run_on_cuda_resumes_exactly(tmp_path):
    gpu = quick(steps=6, save_every=1, device="cuda")
    full = _weights(Trainer(clm_objective(), toy_data(), gpu, tmp_path / "a").fit())
    interrupt_after(Trainer(clm_objective(), toy_data(), gpu, tmp_path / "b"), 3)
    resumed = Trainer(clm_objective(seed=5), toy_data(), gpu, tmp_path / "b")
    assert _same(_weights(resumed.fit(resume=True)), full)
    assert [r["step"] for r in read_metrics(tmp_path / "b" / "metrics.jsonl")] == list(range(1, 7))


def test_a_checkpoint_made_on_cuda_trains_on_the_cpu(tmp_path):
    Trainer(mlm_objective(), toy_data(), quick(steps=2, save_every=1, device="cuda"), tmp_path).fit()
    model = Trainer(mlm_objective(), toy_data(), quick(steps=4, device="cpu"), tmp_path).fit(resume=True)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]  # resumed at 2
    assert all(p.device.type == "cpu" and torch.isfinite(p).all() for p in model.parameters())
    assert lmforge.load(tmp_path / "final").config == model.config


def test_bf16_training_on_cuda_keeps_fp32_weights(tmp_path):
    objective = clm_objective()
    Trainer(objective, toy_data(), quick(steps=4, precision="bf16", device="cuda"), tmp_path).fit()
    assert all(p.dtype == torch.float32 and p.device.type == "cuda" for p in objective.parameters())
    assert all(torch.isfinite(p).all() for p in objective.parameters())


@pytest.mark.parametrize("mode", ["dynamic", "weight-only"])
def test_a_quantised_model_runs_on_cuda_as_its_dequantised_weights(mode):
    model = quantize(tiny_model("bert-base"), mode)
    ids = _ids(model)
    with torch.no_grad():  # with gradients the CPU too would take the dequantised reference path
        cpu = forward(model, ids).last_hidden_state
        gpu = forward(model.cuda(), ids.cuda()).last_hidden_state.cpu()
    # the GPU runs the int8 weights dequantised; the CPU's kernels round the activations (dynamic: to
    # 7 or 8 bits; weight-only: perhaps to bf16)
    tolerance = 0.05 if mode == "dynamic" else 1e-2
    assert (gpu - cpu).norm() <= tolerance * cpu.norm()


def test_a_model_on_cuda_is_calibrated_and_quantised_where_it_is():
    model = tiny_model("bert-base").cuda()
    q = quantize(model)  # the smoothing's calibration batches are built on the CPU, run on the GPU
    assert q.config.quantization["smoothing"]["layers"]
    assert all(b.device.type == "cuda" for b in q.buffers())
