"""FastDropout's cheaper CPU mask: the keep rate, the scale, gradients, seeding, and where torch's stays."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmforge.fast.dropout import LEVELS, FastDropout, dropout
from lmforge.fast.kernels import DroppingKernel


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_and_unbiased_mean(p):
    torch.manual_seed(0)
    n = 1_000_003  # not a multiple of the four lanes a draw gives
    y = dropout(torch.ones(n), p)
    kept = y != 0
    keep = (LEVELS - round(p * LEVELS)) / LEVELS
    sd = (keep * (1 - keep) / n) ** 0.5
    assert abs(kept.float().mean().item() - keep) < 5 * sd
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / keep))  # E[y] = x exactly
    # each of the four 16-bit lanes of a draw keeps at the same rate (no biased bit)
    lanes = kept[: n - n % 4].view(-1, 4).float().mean(0)
    assert (lanes - keep).abs().max() < 5 * sd * 2


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(1)
    x = torch.randn(3, 50, 64, requires_grad=True)
    y = dropout(x, 0.2)
    y.backward(torch.ones_like(y))
    kept = y.detach() != 0
    scale = LEVELS / (LEVELS - round(0.2 * LEVELS))
    assert torch.allclose(x.grad, kept.float() * scale)
    assert torch.allclose(y.detach()[kept], x.detach()[kept] * scale)


def test_seeded_masks_repeat_and_successive_masks_differ():
    x = torch.ones(4096)
    torch.manual_seed(7)
    a, b = dropout(x, 0.3), dropout(x, 0.3)
    torch.manual_seed(7)
    assert torch.equal(dropout(x, 0.3), a)
    assert not torch.equal(a, b)


def test_identity_and_torch_fallbacks():
    x = torch.randn(8, 16)
    assert dropout(x, 0.5, training=False) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))  # p = 1: torch's dropout, all zeros
    torch.manual_seed(3)
    tiny = dropout(x.double(), 0.5)  # float64 keeps torch's dropout: same draw as F.dropout
    torch.manual_seed(3)
    assert torch.equal(tiny, F.dropout(x.double(), 0.5))


def test_module_is_an_nn_dropout():
    layer = FastDropout(0.25)
    assert isinstance(layer, nn.Dropout) and layer.p == 0.25
    x = torch.randn(64, 32)
    assert torch.equal(layer.eval()(x), x)
    y = layer.train()(x)
    assert ((y == 0) | torch.isclose(y, x / (1 - round(0.25 * LEVELS) / LEVELS))).all()


def test_attention_dropout_draws_its_mask_with_dropout():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 10, 8) for _ in range(3))
    bias = torch.zeros(2, 1, 1, 10)
    bias[1, ..., 7:] = torch.finfo(torch.float32).min
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.35)
    kernel = DroppingKernel()
    got, probs = kernel.attend(q, k, v, bias, 0.0, 0.35)
    torch.testing.assert_close(got, want)
    assert probs is None
    # with dropout on CPU: SDPA's math-path steps, the mask drawn by `dropout`
    dropped, _ = kernel.attend(q, k, v, bias, 0.5, 0.35)
    assert dropped.shape == want.shape and not torch.allclose(dropped, want)
    torch.manual_seed(5)
    a, _ = kernel.attend(q, k, v, bias, 0.5, 0.35)
    torch.manual_seed(5)
    scores = (q @ k.transpose(-1, -2)) * 0.35 + bias
    probs = torch.softmax(scores, -1)
    b = dropout(probs, 0.5) @ v
    torch.testing.assert_close(a, b)
