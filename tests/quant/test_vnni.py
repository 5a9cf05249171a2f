"""quant/native.VnniTiles and int8's "u8-vnni" kernel: per-row quantised bytes times int8 weights with
AVX-512 VNNI, summed exactly in int32."""
import pytest
import torch

from lmforge.quant import engines, int8, native
from tests.quant.kernels import few_rows_only

pytestmark = pytest.mark.skipif(not engines.vnni_usable(),
                                reason="no AVX-512 VNNI here, or the native kernel is not built")


def _weight(out=130, cols=76, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (out, cols), dtype=torch.int8, generator=g)
    return q, torch.rand(out, generator=g) + 0.01


def _bytes(rows, cols, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (rows, cols), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("out, cols", [(130, 76), (16, 384), (5, 4), (1152, 384), (384, 1536)])
@pytest.mark.parametrize("rows", [1, 8, 14, 64])
@pytest.mark.parametrize("levels", [127, 63])
def test_the_sums_are_exact_and_scaled_once(out, cols, rows, levels):
    """Every int32 sum (x - zp) q^T is exact; the output is that sum in fp32 times step * scale: three
    fp32 roundings at most (the sum past 2^24, step * scale, the product) from the exact value."""
    q, scale = _weight(out, cols)
    x = _bytes(rows, cols)
    x = x.clamp(1, 2 * levels + 1)  # bytes a row quantised to `levels` holds
    exact = (x.long() - (levels + 1)) @ q.long().T  # (rows, out) int64
    y = native.VnniTiles(q, scale)(x, levels)
    want = exact.double() * (scale.double() / levels)
    assert y.shape == (rows, out)
    assert ((y.double() - want).abs() <= 3e-7 * want.abs() + 1e-30).all()


def test_rows_are_independent_of_their_batch_and_of_the_thread_count():
    q, scale = _weight(out=1000, cols=96)  # 63 tiles: split over threads
    x = _bytes(13, 96)
    tiles = native.VnniTiles(q, scale)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        split = tiles(x, 127)
    finally:
        torch.set_num_threads(1)
    try:
        serial = tiles(x, 127)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(split, serial)
    assert all(torch.equal(tiles(x[i:i + 1], 127)[0], split[i]) for i in range(13))


def test_arguments_the_c_code_would_misread_are_refused():
    q, scale = _weight()
    with pytest.raises(ValueError, match="q: "):
        native.VnniTiles(q.float(), scale)
    with pytest.raises(ValueError, match="q: "):
        native.VnniTiles(q[:, :75], scale)  # inputs not a multiple of 4
    with pytest.raises(ValueError, match="scale: "):
        native.VnniTiles(q, scale[:-1])
    tiles = native.VnniTiles(q, scale)
    for bad in (_bytes(2, 72), _bytes(2, 76).float(), _bytes(1, 76)[0]):
        with pytest.raises(ValueError, match="x: "):
            tiles(bad, 127)
    with pytest.raises(ValueError, match="levels: "):
        tiles(_bytes(2, 76), 128)
    strided = _bytes(76, 3).T  # read as its values, not its storage order
    assert torch.equal(tiles(strided, 127), tiles(strided.contiguous(), 127))


def test_the_kernel_is_offered_at_few_rows_only_and_equals_onednn_u8_smoothed_too():
    """The same bytes as "onednn-u8" multiplies (rowquant.c quantises both), so the two agree to fp32
    rounding, and with fp32 to int8's own error."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 40)
    for layer in (int8.Int8Linear.from_linear(linear, "dynamic"),
                  int8.Int8Linear.from_linear(linear, "dynamic", smooth=torch.rand(96) + 0.5)):
        assert few_rows_only(layer, engines.VNNI)
        x = torch.randn(14, 96)
        with torch.no_grad():
            out, u8, fp32 = (layer.run(k, x) for k in (engines.VNNI, engines.U8, "fp32"))
        torch.testing.assert_close(out, u8, rtol=1e-5, atol=1e-5)
        assert int8.agrees(out, fp32)
    weight_only = int8.Int8Linear.from_linear(linear, "weight-only")
    assert engines.VNNI not in weight_only.candidates(1)


def test_a_layer_whose_inputs_the_kernel_cannot_take_runs_its_other_kernels():
    """u8_vnni reads inputs four at a time: a layer of 30 inputs is offered the other kernels only."""
    torch.manual_seed(0)
    layer = int8.Int8Linear.from_linear(torch.nn.Linear(30, 40), "dynamic")
    assert engines.VNNI not in layer.candidates(8)
    x = torch.randn(5, 30)
    with torch.no_grad():
        assert int8.agrees(layer(x), layer.run("fp32", x))


def test_the_kernels_are_right_whatever_the_default_dtype():
    """The row peaks and outputs the C code writes are float32 buffers, not the default dtype's."""
    torch.manual_seed(0)
    layer = int8.Int8Linear.from_linear(torch.nn.Linear(96, 40), "dynamic")
    x = torch.randn(14, 96)
    with torch.no_grad():
        want = {k: layer.run(k, x) for k in (engines.VNNI, engines.U8)}
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad():
            got = {k: layer.run(k, x) for k in want}
    finally:
        torch.set_default_dtype(before)
    assert all(torch.equal(got[k], want[k]) for k in want)
