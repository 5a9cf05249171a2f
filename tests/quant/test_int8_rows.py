"""quant/int8's dynamic product: a row's output does not depend on the other rows of its call."""
import pytest
import torch

from lmforge.quant import int8
from lmforge.quant.engines import QUANTISING


@pytest.mark.parametrize("smoothed", [False, True])
def test_a_row_gives_the_same_output_alone_and_in_any_batch(smoothed, monkeypatch):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    smooth = torch.rand(64) + 0.5 if smoothed else None
    layer = int8.Int8Linear.from_linear(linear, "dynamic", smooth=smooth).eval()
    engines = [k for k in layer.candidates() if k in QUANTISING]  # onednn-u8 too, where it is built
    if not engines:
        pytest.skip("this torch build has no quantized engine")
    x = torch.randn(40, 64)
    x[3] *= 50  # a row with a far larger range than the others: per row, it must not coarsen theirs
    x[7] = x[7].abs()  # a row with no negative value: alone, its own range would not reach -1
    for kernel in engines:
        monkeypatch.setattr(int8, "CHOICES", {})
        with torch.no_grad():
            together = layer.run(kernel, x)
            alone = torch.cat([layer.run(kernel, x[i:i + 1]) for i in range(len(x))])
            pairs = torch.cat([layer.run(kernel, x[i:i + 2]) for i in range(0, len(x), 2)])
        # within float rounding, not bitwise: oneDNN picks its code by row count (on an AMX Xeon, AMX
        # tiles for 40 rows, VNNI for 1), and their fp32 scaling differs in the last bit (5e-8 relative).
        # A range shared across rows (row 3's) would be ~0.5 off here, thousands of times this bound
        bound = 1e-6 * float(together.abs().max())
        for other in (alone, pairs):
            assert float((together - other).abs().max()) <= bound, kernel
        assert (together - linear(x)).norm() < 0.05 * linear(x).norm()  # and it is the product still
