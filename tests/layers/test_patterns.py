"""Every sparse pattern: the mask matches its definition, and attention equals dense under it."""
import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.layers.attention import attend
from lmforge.layers.stack import additive
from lmforge.layers.patterns import (draw_random_blocks, bigbird_random_blocks, default_global_tokens,
                                     pattern_mask)

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
    assert torch.equal(draw_random_blocks(cfg.n_random_blocks, 8, 3),
                       draw_random_blocks(cfg.n_random_blocks, 8, 3))
    assert torch.equal(bigbird_random_blocks(cfg, 8, 3), draw_random_blocks(cfg.n_random_blocks, 8, 3))
    assert any(not torch.equal(bigbird_random_blocks(cfg, 8, 0), bigbird_random_blocks(cfg, 8, layer))
               for layer in range(1, 5))


def test_window_schedule_gives_each_layer_its_window():
    cfg = _cfg(attention="longformer", n_layers=2, window_schedule=[4, 8])
    pos = torch.arange(T)
    glob = torch.zeros(1, T, dtype=torch.bool)
    narrow, wide = (pattern_mask(cfg, "longformer", pos, pos, False, glob, layer)[0, 0] for layer in (0, 1))
    assert narrow[10, 12] and not narrow[10, 13] and wide[10, 14] and not wide[10, 15]
    from lmforge.layers.stack import Stack

    assert Stack(cfg, 2, causal=False, cross=False).mask_keys == ["longformer@w4", "longformer@w8"]


def test_bigbird_first_block_choice_equals_repeating_the_first_block():
    """random_block_choice="first": the middle query blocks see the first block 1 + r times; the
    score bias log(1 + r) equals attending over r extra copies of its keys."""
    from lmforge.layers.patterns import pattern_bias

    cfg = _cfg(attention="bigbird", random_block_choice="first").replace(n_random_blocks=2)
    pos = torch.arange(T)
    allowed = _mask(cfg, "bigbird")
    bias = additive(allowed, pattern_bias(cfg, "bigbird", pos, pos, 0), torch.float64)
    q, k, v = (torch.randn(1, 2, T, 8, dtype=torch.float64) for _ in range(3))
    out, _ = attend(q, k, v, bias, scale=8 ** -0.5)
    first = slice(0, cfg.block_size)
    for i in (0, 5, 13, T - 1):  # query blocks 0, 1, 3 and the last
        keys = allowed[0, 0, i].nonzero()[:, 0].tolist()
        middle = 0 < i // cfg.block_size < T // cfg.block_size - 1
        keys += list(range(first.stop)) * (2 if middle else 0)  # r = 2 duplicates of the first block
        w = torch.softmax(torch.einsum("hd,hkd->hk", q[0, :, i], k[0, :, keys]) * 8 ** -0.5, -1)
        torch.testing.assert_close(out[0, :, i], torch.einsum("hk,hkd->hd", w, v[0, :, keys]))


def test_bigbird_dense_max_len_attends_fully_up_to_it():
    cfg = _cfg(attention="bigbird", dense_max_len=T)
    assert _mask(cfg, "bigbird") is None
    assert _mask(cfg.replace(dense_max_len=T - 1), "bigbird") is not None
