import math

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.layers.positions import (ALiBi, RelativeBias, Rotary, alibi_slopes, apply_rotary,
                                      relative_position_bucket, sinusoidal_table)


def test_sinusoidal_inner_products_depend_only_on_offset():
    table = sinusoidal_table(128, 64).double()
    gram = table @ table.T  # (P, P)
    for offset in (0, 1, 7, 30):
        diagonal = torch.diagonal(gram, offset)
        torch.testing.assert_close(diagonal, diagonal[0].expand_as(diagonal), atol=1e-4, rtol=0)


def test_sinusoidal_matches_the_paper_formula():
    table = sinusoidal_table(50, 16)
    pos, i = 37, 3
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 16)), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 16)), abs=1e-6)


@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_rotary_scores_depend_only_on_offset(rotary_dim):
    cfg = ModelConfig(d_model=64, n_heads=4, position="rotary", rotary_dim=rotary_dim)
    rope = Rotary(cfg)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(i, j):
        cos_i, sin_i = rope(torch.tensor([[i]]))
        cos_j, sin_j = rope(torch.tensor([[j]]))
        return (apply_rotary(q, cos_i, sin_i) * apply_rotary(k, cos_j, sin_j)).sum().item()

    for offset in (0, 3, 11):
        assert score(5 + offset, 5) == pytest.approx(score(40 + offset, 40), abs=1e-4)
    if rotary_dim:  # dimensions past rotary_dim are left alone
        cos, sin = rope(torch.tensor([[9]]))
        torch.testing.assert_close(apply_rotary(q, cos, sin)[..., 8:], q[..., 8:])


def test_rotary_preserves_norms():
    rope = Rotary(ModelConfig(d_model=64, n_heads=4, position="rotary"))
    x = torch.randn(2, 4, 10, 16)
    cos, sin = rope(torch.arange(10)[None])
    torch.testing.assert_close(apply_rotary(x, cos, sin).norm(dim=-1), x.norm(dim=-1))


def test_alibi_slopes_are_the_papers_geometric_sequence():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    s16 = alibi_slopes(16)
    torch.testing.assert_close(s16[1:] / s16[:-1], torch.full((15,), 2 ** -0.5))
    # 12 heads: the 8-head sequence, then every other slope of the 16-head sequence
    expected = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** (-(2 * i + 1) / 2) for i in range(4)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected))


def test_alibi_bias_is_linear_in_distance():
    cfg = ModelConfig(n_heads=4, d_model=32, position="alibi")
    pos = torch.arange(6)
    bias = ALiBi(cfg, bidirectional=True)(pos, pos)[0]  # (H, T, T)
    slopes = alibi_slopes(4)
    torch.testing.assert_close(bias[:, 4, 1], -3 * slopes)
    torch.testing.assert_close(bias[:, 1, 4], -3 * slopes)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("buckets, max_distance", [(32, 128), (8, 16)])
def test_t5_buckets_equal_the_reference_function(bidirectional, buckets, max_distance):
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    relative = torch.arange(-300, 300)[None, :] - torch.arange(0, 40)[:, None]
    ours = relative_position_bucket(relative, bidirectional, buckets, max_distance)
    theirs = t5.T5Attention._relative_position_bucket(relative, bidirectional, buckets, max_distance)
    assert torch.equal(ours, theirs)


def test_relative_bias_is_shared_per_offset():
    cfg = ModelConfig(n_heads=2, d_model=16, position="relative-bias", relative_buckets=8)
    bias = RelativeBias(cfg, bidirectional=True)
    torch.nn.init.normal_(bias.weight)
    pos = torch.arange(10)
    table = bias(pos, pos)[0]
    torch.testing.assert_close(table[:, 3, 5], table[:, 6, 8])  # same offset, same bias


def test_rotation_and_xl_terms_are_one_position_step_of_attention():
    from lmforge.layers.variants.two_stream import XLNetContext
    from lmforge.layers.variants.xl_relative import XLRelativeBias

    T = 6
    q, k = torch.randn(2, 4, T, 8), torch.randn(2, 4, T, 8)
    pos = torch.arange(T)
    rotation = Rotary(ModelConfig(d_model=32, n_heads=4, position="rotary"))(pos[None])
    cos, sin = rotation  # still a (cos, sin) pair
    q_rot, k_rot, bias = rotation(q, k, None)
    assert bias is None
    torch.testing.assert_close(q_rot, apply_rotary(q, cos, sin))
    torch.testing.assert_close(k_rot, apply_rotary(k, cos, sin))
    xl = XLRelativeBias(ModelConfig(d_model=32, n_heads=4, position="xl-relative", n_segments=0))
    for p in xl.parameters():
        torch.nn.init.normal_(p)
    q_xl, k_xl, bias = xl.eval()(q, k, XLNetContext(pos, pos))
    # a bias, and q shifted by u: (q + u)·k is the content term
    assert k_xl is k and bias.shape == (2, 4, T, T)
    torch.testing.assert_close(q_xl, q + xl.r_w_bias[:, None])
