"""Linear's inference path (matmul, then the bias in place) equals F.linear; other cases use F.linear."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmforge.layers.linear import MIN_ROWS, Linear, bias_after


def _layer(d_in=48, d_out=80, bias=True, input_major=False) -> Linear:
    torch.manual_seed(0)
    layer = Linear(d_in, d_out, bias=bias)
    if input_major:  # the decode layout (layers/fastpath.py weight_layout): (in, out) storage
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
