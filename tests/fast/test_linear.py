"""FastLinear's inference paths (oneDNN's linear; matmul, then the bias in place) equal F.linear; other
cases use F.linear."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmforge.fast import linear
from lmforge.fast.linear import MIN_ROWS, FastLinear, bias_after


def _layer(d_in=48, d_out=80, bias=True, input_major=False) -> FastLinear:
    torch.manual_seed(0)
    layer = FastLinear(d_in, d_out, bias=bias)
    if input_major:  # (in, out) storage, as a transposed copy is laid out
        layer.weight.data = layer.weight.data.t().contiguous().t()
    return layer


@pytest.mark.parametrize("input_major", [False, True])
@pytest.mark.parametrize("shape", [(MIN_ROWS, 48), (3, 40, 48), (2, 130, 48)])
def test_inference_path_equals_f_linear(shape, input_major):
    layer = _layer(input_major=input_major)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert bias_after(x, layer.weight, layer.bias)
        got = layer(x)
        want = F.linear(x, layer.weight, layer.bias)
    assert got.shape == shape[:-1] + (80,)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_no_grad_takes_it_too_and_leaves_the_bias_alone():
    layer = _layer()
    bias = layer.bias.detach().clone()
    x = torch.randn(MIN_ROWS, 48)
    with torch.no_grad():
        assert bias_after(x, layer.weight, layer.bias)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-6, atol=1e-6)
    assert torch.equal(layer.bias, bias)


def test_other_cases_keep_f_linear():
    layer = _layer()
    rows = torch.randn(MIN_ROWS, 48)
    assert not bias_after(rows, layer.weight, layer.bias)  # grad enabled: training keeps addmm
    with torch.no_grad():
        assert not bias_after(rows[: MIN_ROWS - 1], layer.weight, layer.bias)  # a decoding step's few rows
        assert not bias_after(rows, layer.weight, None)
        assert not bias_after(rows.double(), layer.weight, layer.bias)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not bias_after(rows, layer.weight, layer.bias)
            assert layer(rows).dtype == torch.bfloat16  # autocast's F.linear, as nn.Linear gives


def test_training_gradients_are_nn_linear_ones():
    ours, ref = _layer(), nn.Linear(48, 80)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(MIN_ROWS, 48)
    ours(x).square().sum().backward()
    ref(x).square().sum().backward()
    assert torch.equal(ours.weight.grad, ref.weight.grad) and torch.equal(ours.bias.grad, ref.bias.grad)


def test_same_parameters_as_nn_linear():
    layer = _layer(bias=False)
    assert isinstance(layer, nn.Linear) and list(layer.state_dict()) == ["weight"]
    with torch.inference_mode():
        x = torch.randn(MIN_ROWS, 48)
        assert torch.equal(layer(x), F.linear(x, layer.weight))


# oneDNN's linear (FastPaths.onednn_linear)

needs_onednn = pytest.mark.skipif(not linear.ONEDNN, reason="this torch has no oneDNN linear")


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("input_major", [False, True])
@pytest.mark.parametrize("shape", [(1, 48), (5, 48), (3, 40, 48), (2, 130, 48), (0, 48)])
def test_onednn_route_equals_f_linear(shape, input_major, bias):
    layer = _layer(bias=bias, input_major=input_major)
    layer.onednn, layer.small_plain = True, False  # its calls are small: oneDNN only when asked
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        got = layer(x)
        taken = torch.ops.mkldnn._linear_pointwise(x, layer.weight, layer.bias, "none", [], "")
        want = F.linear(x, layer.weight, layer.bias)
    assert torch.equal(got, taken) and got.shape == shape[:-1] + (80,)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_a_call_too_small_to_repay_onednn_keeps_f_linear_unless_asked(monkeypatch):
    """oneDNN's linear costs ~15 us a call before any work: a call of under ONEDNN_MIN_WORK multiply-adds
    (rows x weight values: bert-tiny's at batch 1) stays on F.linear; more rows, a larger weight or
    small_plain=False take oneDNN."""
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(linear.torch.ops.mkldnn, "_linear_pointwise",
                        lambda *a: calls.append(a[0].shape) or real(*a))
    small, large = FastLinear(128, 384), FastLinear(1024, 512)
    few = torch.randn(linear.ONEDNN_MIN_WORK // small.weight.numel(), 128)  # 10 rows: just under
    assert few.shape[0] * small.weight.numel() < linear.ONEDNN_MIN_WORK <= large.weight.numel()
    for layer in (small, large):
        layer.onednn = True
    with torch.inference_mode():
        assert torch.equal(small(few), F.linear(few, small.weight, small.bias)) and calls == []
        small(torch.randn(few.shape[0] + 1, 128)), large(torch.randn(1, 1024))
        assert calls == [(few.shape[0] + 1, 128), (1, 1024)]
        small.small_plain = False
        small(few[:1])
    assert calls[-1] == (1, 128)


@needs_onednn
def test_onednn_route_leaves_training_autocast_and_float64_to_f_linear():
    ours, ref = _layer(), nn.Linear(48, 80)
    ref.load_state_dict(ours.state_dict())
    ours.onednn = True
    x = torch.randn(MIN_ROWS, 48)
    ours(x).square().sum().backward()  # autograd: F.linear's graph, the same gradients
    ref(x).square().sum().backward()
    assert torch.equal(ours.weight.grad, ref.weight.grad) and torch.equal(ours.bias.grad, ref.bias.grad)
    with torch.no_grad():
        assert not linear.onednn_applies(x.double(), ours.weight, ours.bias)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert ours(x).dtype == torch.bfloat16


@needs_onednn
def test_optimize_turns_onednn_on_per_its_paths_and_off_again():
    import lmforge
    from lmforge.fast.paths import FastPaths

    model = lmforge.build(lmforge.tiny("bert-tiny")).eval()

    def linears() -> list:
        return [m for m in model.modules() if isinstance(m, nn.Linear)]

    lmforge.optimize(model)
    assert all(type(m) is FastLinear and m.onednn for m in linears())
    lmforge.optimize(model, paths=FastPaths(onednn_linear=False))
    assert not any(m.onednn for m in linears())
    lmforge.optimize(model)
    lmforge.optimize(model, paths=FastPaths(onednn_linear=False, accelerate=False))  # the layers stay fast
    assert all(type(m) is FastLinear and not m.onednn for m in linears())
    lmforge.optimize(model, enabled=False)
    assert all(type(m) is nn.Linear and "onednn" not in m.__dict__ for m in linears())


@needs_onednn
def test_onednn_route_is_left_where_onednn_would_misread_or_is_off():
    layer = _layer()
    layer.onednn = True
    layer.bias = nn.Parameter(torch.randn(160)[::2])  # strided: oneDNN would read it as dense
    x = torch.randn(MIN_ROWS, 48)
    with torch.inference_mode():
        assert not linear.onednn_applies(x, layer.weight, layer.bias)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-6, atol=1e-6)
        layer.bias = nn.Parameter(torch.randn(1).expand(80))  # stride 0: read past its storage
        assert not linear.onednn_applies(x, layer.weight, layer.bias)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-6, atol=1e-6)
        torch.backends.mkldnn.enabled = False  # (its flags() context also sets a TF32 flag, with a warning)
        try:
            assert not linear.onednn_applies(x, layer.weight, None)
        finally:
            torch.backends.mkldnn.enabled = True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # initialising a zero-element weight is a no-op
            empty = FastLinear(0, 5)
        empty.onednn = True
        assert torch.equal(empty(torch.randn(3, 0)), empty.bias.expand(3, 5))  # no input features: the bias


# transient outputs: reused per-thread buffers for intermediates that die inside a layer

def test_transient_equals_the_call_and_reuses_its_buffer(monkeypatch):
    monkeypatch.setattr(linear, "SCRATCH_MIN_BYTES", 0)
    for bias in (True, False):
        layer = _layer(bias=bias)
        x = torch.randn(2, 70, 48, generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            first = layer.transient(x, "test")
            assert torch.equal(first, layer(x))
            pointer = first.data_ptr()
            second = layer.transient(x[:, :50], "test")  # smaller: the same buffer
            assert second.data_ptr() == pointer and torch.equal(second, layer(x[:, :50]))
    linear.release_scratch()


def test_transient_is_a_plain_call_where_it_must_be(monkeypatch):
    monkeypatch.setattr(linear, "SCRATCH_MIN_BYTES", 0)
    layer = _layer()
    x = torch.randn(2, 70, 48)
    with torch.inference_mode():
        layer.transient(x, "test")
        pointer = layer.transient(x, "test").data_ptr()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert layer.transient(x, "test").dtype == torch.bfloat16
        seen = []
        handle = layer.register_forward_hook(lambda module, args, out: seen.append(out))
        layer.slot = "test"  # as accelerate names it: the call itself goes through transient
        assert layer(x).data_ptr() != pointer and len(seen) == 1  # a hook sees a fresh output
        handle.remove()
        assert layer(x).data_ptr() == pointer
        del layer.slot
    out = layer.transient(x.requires_grad_(), "test")  # autograd: a fresh output with a graph
    assert out.requires_grad and out.data_ptr() != pointer
    monkeypatch.setattr(linear, "SCRATCH_MIN_BYTES", 1 << 40)
    with torch.inference_mode():
        assert layer.transient(x, "test").data_ptr() != pointer  # small outputs come from the allocator
    linear.release_scratch()


def test_a_buffer_made_under_inference_mode_is_replaced_for_no_grad(monkeypatch):
    monkeypatch.setattr(linear, "SCRATCH_MIN_BYTES", 0)
    layer, x = _layer(), torch.randn(2, 70, 48)
    with torch.inference_mode():
        layer.transient(x, "test")  # an inference tensor: not writable outside inference_mode
    with torch.no_grad():
        out = layer.transient(x, "test")  # once raised "Inplace update to inference tensor"
        assert not out.is_inference() and torch.equal(out, layer.plain(x))
        assert layer.transient(x, "test").data_ptr() == out.data_ptr()  # and is then reused
    linear.release_scratch()


def test_threads_get_their_own_buffers(monkeypatch):
    import threading

    monkeypatch.setattr(linear, "SCRATCH_MIN_BYTES", 0)
    layer, x, pointers = _layer(), torch.randn(70, 48), []
    barrier = threading.Barrier(2)  # both threads hold their buffers at once: no address can be reused

    def run():
        with torch.inference_mode():
            pointers.append(layer.transient(x, "test").data_ptr())
        barrier.wait()
        linear.release_scratch()

    with torch.inference_mode():  # this thread's buffer first, held while the others run
        pointers.append(layer.transient(x, "test").data_ptr())
    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(pointers)) == 3
    linear.release_scratch()


@pytest.mark.parametrize("name", ["bert-tiny", "gpt2", "t5-small", "llama-3.2-1b", "xlnet-base"])
def test_models_give_the_same_outputs_and_tokens_with_transient_buffers(monkeypatch, name):
    import lmforge
    from lmforge.fast.paths import FastPaths
    from lmforge.heads import attach

    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny(name)).eval()
    lmforge.optimize(model, paths=FastPaths(onednn_linear=False))  # oneDNN's outputs are always fresh
    ids = torch.randint(3, 99, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding: packed rows in encoders, padded rows in decoders

    def run():
        with torch.inference_mode():
            if model.config.architecture == "encoder" or name == "xlnet-base":
                return model(ids, mask, run_heads=False).last_hidden_state
            attach(model, "lm") if "lm" not in model.heads else None
            extra = {"decoder_start_token_id": 0} if model.config.architecture == "encoder-decoder" else {}
            return lmforge.generate(model, ids, mask, max_new_tokens=5, **extra)

    monkeypatch.setattr(linear, "SCRATCH_MIN_BYTES", 1 << 40)
    plain = run()
    monkeypatch.setattr(linear, "SCRATCH_MIN_BYTES", 0)
    assert torch.equal(run(), plain)
    linear.release_scratch()


ALLOCATORS = {"/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4": "libtcmalloc-minimal4",
              "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2": "libjemalloc2"}


@pytest.mark.parametrize("library", list(ALLOCATORS))
def test_no_scratch_buffers_under_an_allocator_that_pools_large_blocks(library):
    import os
    import subprocess
    import sys

    if not os.path.isfile(library):
        pytest.skip(f"no {os.path.basename(library)} (apt-get install {ALLOCATORS[library]})")
    probe = "import lmforge.fast.linear as L; print(L.pooling_allocator(), L.SCRATCH_MIN_BYTES > 1 << 40)"
    run = [sys.executable, "-c", probe]
    pooled = subprocess.run(run, env={**os.environ, "LD_PRELOAD": library}, capture_output=True, text=True,
                            check=True)
    plain = subprocess.run(run, env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
                           capture_output=True, text=True, check=True)
    assert pooled.stdout.split() == ["True", "True"] and plain.stdout.split() == ["False", "False"]
