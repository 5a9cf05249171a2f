"""Every sparse pattern: the mask matches its definition, and attention equals dense under it."""
import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.layers.attention import attend
from lmforge.layers.stack import additive
from lmforge.layers.patterns import bigbird_random_blocks, default_global_tokens, pattern_mask

T = 24


def _cfg(**kw):
    return ModelConfig(d_model=32, n_heads=4, max_seq_len=64, window=6, dilation=2, block_size=4,
                       n_random_blocks=1, **kw)


def _mask(cfg, pattern, causal=False, global_tokens=None):
    pos = torch.arange(T)
    return pattern_mask(cfg, pattern, pos, pos, causal, global_tokens, 0)


def test_sliding_window_definition():
    m = _mask(_cfg(), "sliding-window")[0, 0]
    assert m[10, 7] and m[10, 13] and not m[10, 6] and not m[10, 14]
    c = _mask(_cfg(), "sliding-window", causal=True)[0, 0]  # i - 6 < j <= i (Mistral)
    assert c[10, 5] and c[10, 10] and not c[10, 4] and not c[10, 11]


def test_dilated_definition():
    m = _mask(_cfg(), "dilated")[0, 0]  # every 2nd key, 3 per side
    assert [j for j in range(T) if m[10, j]] == [4, 6, 8, 10, 12, 14, 16]
    c = _mask(_cfg(), "dilated", causal=True)[0, 0]  # 6 keys back, step 2
    assert [j for j in range(T) if c[20, j]] == [10, 12, 14, 16, 18, 20]


def test_longformer_global_tokens_are_symmetric():
    cfg = _cfg()
    glob = default_global_tokens(cfg, 1, T, "cpu")
    glob[0, 17] = True
    m = _mask(cfg, "longformer", global_tokens=glob)[0, 0]
    assert m[0].all() and m[:, 0].all() and m[17].all() and m[:, 17].all()
    assert not m[5, 12] and m[5, 8]


def test_bigbird_blocks():
    cfg = _cfg()
    m = _mask(cfg, "bigbird")[0, 0]
    blocks = T // cfg.block_size
    randoms = bigbird_random_blocks(cfg, blocks, 0)
    for qb in range(blocks):
        for kb in range(blocks):
            expect = (abs(qb - kb) <= 1 or qb in (0, blocks - 1) or kb in (0, blocks - 1)
                      or bool(randoms[qb, kb]))
            block = m[qb * 4:(qb + 1) * 4, kb * 4:(kb + 1) * 4]
            assert bool(block.all()) == expect and bool(block.any()) == expect
    assert randoms[1:-1].sum(1).tolist() == [1] * (blocks - 2)  # r random blocks per query block


@pytest.mark.parametrize("pattern", ["sliding-window", "dilated", "longformer", "bigbird"])
def test_sparse_attention_equals_dense_attention_under_its_mask(pattern):
    """Reference: a naive loop over queries that softmaxes only the allowed keys."""
    cfg = _cfg()
    glob = default_global_tokens(cfg, 2, T, "cpu")
    allowed = _mask(cfg, pattern, global_tokens=glob).expand(2, 1, T, T)
    q, k, v = (torch.randn(2, 4, T, 8, dtype=torch.float64) for _ in range(3))
    bias = additive(allowed, None, torch.float64)
    out, _ = attend(q, k, v, bias, scale=8 ** -0.5)
    ref = torch.empty_like(out)
    for b in range(2):
        for i in range(T):
            keys = allowed[b, 0, i].nonzero()[:, 0]
            w = torch.softmax(torch.einsum("hd,hkd->hk", q[b, :, i], k[b, :, keys]) * 8 ** -0.5, -1)
            ref[b, :, i] = torch.einsum("hk,hkd->hd", w, v[b, :, keys])
    torch.testing.assert_close(out, ref)


def test_bigbird_random_blocks_are_reproducible_and_differ_by_layer():
    cfg = _cfg(attention="bigbird")
    assert torch.equal(bigbird_random_blocks(cfg, 8, 3), bigbird_random_blocks(cfg, 8, 3))
    assert any(not torch.equal(bigbird_random_blocks(cfg, 8, 0), bigbird_random_blocks(cfg, 8, layer))
               for layer in range(1, 5))
