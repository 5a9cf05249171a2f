"""quant/native.Int8Tiles and int8's "w8a32" kernel: int8 weights widened to fp32 against fp32 input."""
import functools

import pytest
import torch

from lmforge.quant import engines, int8, native
from tests.quant.kernels import few_rows_only

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason="the native kernel is not built here (no gcc, or no libgomp in torch)")


def _weight(out=130, cols=77, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (out, cols), dtype=torch.int8, generator=g)
    return q, torch.rand(out, generator=g) + 0.01, torch.randn(out, generator=g)


@pytest.mark.parametrize("out, cols", [(130, 77), (64, 768), (5, 3), (200, 16)])
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_the_product_is_the_dequantised_linear_to_fp32_rounding(out, cols, rows):
    q, scale, bias = _weight(out, cols)
    x = torch.randn(rows, cols)
    reference = x.double() @ (q.double() * scale.double()[:, None]).T  # (rows, out)
    tiles = native.Int8Tiles(q, scale)
    for b in (None, bias):
        y = tiles(x, b)
        expected = reference if b is None else reference + b.double()
        bound = 1e-6 * cols * (x.double().abs() @ (q.double().abs() * scale.double()[:, None]).T) + 1e-6
        assert y.shape == (rows, out) and ((y.double() - expected).abs() <= bound).all()


def test_integer_inputs_give_exact_sums_below_two_to_the_24():
    q, scale, _ = _weight(out=96, cols=768)  # 768 x 127 x 127 < 2^24: every partial sum exact in fp32
    x = torch.randint(-127, 128, (4, 768), generator=torch.Generator().manual_seed(1)).float()
    x[0] = 127
    q[0] = 127  # the largest sum the screen's probe meets
    exact = (x.long() @ q.long().T).float() * scale
    assert torch.equal(native.Int8Tiles(q, scale)(x), exact)


def test_rows_are_independent_of_their_batch_and_of_the_thread_count():
    q, scale, bias = _weight(out=1000, cols=96)  # 16 tiles: split over threads
    x = torch.randn(7, 96)
    tiles = native.Int8Tiles(q, scale)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        split = tiles(x, bias)
    finally:
        torch.set_num_threads(1)
    try:
        serial = tiles(x, bias)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(split, serial)
    assert all(torch.equal(tiles(x[i:i + 1], bias)[0], split[i]) for i in range(7))


def test_a_non_finite_row_comes_out_non_finite_and_spoils_no_other_row():
    q, scale, bias = _weight()
    x = torch.randn(4, 77)
    x[1, 5] = float("nan")
    y = native.Int8Tiles(q, scale)(x, bias)
    assert y[1].isnan().all() and torch.isfinite(y[[0, 2, 3]]).all()


def test_arguments_the_c_code_would_misread_are_refused():
    q, scale, bias = _weight()
    with pytest.raises(ValueError, match="q: "):
        native.Int8Tiles(q.float(), scale)
    with pytest.raises(ValueError, match="scale: "):
        native.Int8Tiles(q, scale[:-1])
    tiles = native.Int8Tiles(q, scale)
    for bad in (torch.randn(2, 76), torch.randn(2, 77).double(), torch.randn(77)):
        with pytest.raises(ValueError, match="x: "):
            tiles(bad)
    with pytest.raises(ValueError, match="bias: "):
        tiles(torch.randn(2, 77), bias.double())
    strided = torch.randn(77, 3).T  # read as its values, not its storage order
    assert torch.equal(tiles(strided, bias), tiles(strided.contiguous(), bias))


def test_the_kernel_is_offered_at_few_rows_only_and_agrees_with_fp32_smoothed_too():
    assert engines.w8a32_usable()
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 40)
    for layer in (int8.Int8Linear.from_linear(linear, "weight-only"),
                  int8.Int8Linear.from_linear(linear, "dynamic", smooth=torch.rand(96) + 0.5)):
        assert few_rows_only(layer, engines.W8A32)
        x = torch.randn(5, 96)
        with torch.no_grad():
            out, dequantised = layer.run(engines.W8A32, x), layer.run("fp32", x)
        assert torch.allclose(out, dequantised, rtol=1e-5, atol=1e-5)  # the same product, another order


def test_the_portable_c_gives_the_same_products(tmp_path, monkeypatch):
    """The library as built where torch's CPU capability is the baseline: built here, in this process (a
    process of its own under ATEN_CPU_CAPABILITY=default spent seconds importing torch)."""
    monkeypatch.setenv("LMFORGE_NATIVE", str(tmp_path))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    monkeypatch.setattr(native, "library", functools.cache(native.library.__wrapped__))
    q = torch.randint(-127, 128, (70, 45), dtype=torch.int8)
    s, x = torch.rand(70), torch.randn(3, 45)
    y = native.Int8Tiles(q, s)(x)
    ref = x.double() @ (q.double() * s.double()[:, None]).T
    assert native.isa_flags() == () and [p.suffix for p in tmp_path.iterdir()] == [".so"]
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-4), (y.double() - ref).abs().max()
