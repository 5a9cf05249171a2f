import pytest
import torch

import lmforge
from lmforge.config import ModelConfig
from lmforge.layers.attention import Attention, AttentionContext, KVCache, attend
from lmforge.layers.variants.longformer import LongformerGlobalAttention
from lmforge.layers.variants.two_stream import XLNetContext
from lmforge.layers.variants.xl_relative import XLRelativeBias

D, H, T = 32, 4, 10


def _ctx(t=T, **kw):
    pos = torch.arange(t)
    return AttentionContext(pos, pos, **kw)


def _init(module):
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return module


@pytest.mark.parametrize("n_kv", [2, 1])
def test_gqa_equals_mha_with_repeated_kv_heads(n_kv):
    cfg = ModelConfig(d_model=D, n_heads=H, n_kv_heads=n_kv)
    gqa = _init(Attention(cfg)).eval()
    mha = Attention(cfg.replace(n_kv_heads=None)).eval()
    dh, group = D // H, H // n_kv
    q_w, k_w, v_w = gqa.qkv.weight.split([D, n_kv * dh, n_kv * dh])
    q_b, k_b, v_b = gqa.qkv.bias.split([D, n_kv * dh, n_kv * dh])
    repeat = lambda w: w.view(n_kv, dh, -1).repeat_interleave(group, 0).reshape(D, -1).squeeze(-1)
    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([q_w, repeat(k_w), repeat(v_w)]))
        mha.qkv.bias.copy_(torch.cat([q_b, repeat(k_b), repeat(v_b)]))
        mha.out.load_state_dict(gqa.out.state_dict())
    x = torch.randn(2, T, D)
    torch.testing.assert_close(gqa(x, _ctx(), 0)[0], mha(x, _ctx(), 0)[0])
    assert gqa.qkv.weight.shape[0] == D + 2 * n_kv * dh  # fewer kv parameters


def test_analysis_path_returns_probabilities_with_identical_outputs():
    q, k, v = torch.randn(2, H, T, 8), torch.randn(2, 2, T, 8), torch.randn(2, 2, T, 8)
    bias = torch.randn(1, H, T, T)
    fused, none = attend(q, k, v, bias, scale=0.3)
    explicit, probs = attend(q, k, v, bias, scale=0.3, return_probs=True)
    assert none is None and probs.shape == (2, H, T, T)
    torch.testing.assert_close(explicit, fused, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, H, T))


@pytest.mark.parametrize("name", ["bert-base", "t5-small", "llama-3.2-1b", "longformer-base"])
def test_model_outputs_do_not_change_when_attention_is_returned(name):
    model = lmforge.build(lmforge.tiny(name)).eval()
    ids = torch.randint(0, 99, (2, 12))
    kw = {"decoder_input_ids": ids} if model.config.architecture == "encoder-decoder" else {}
    plain = model(ids, **kw).last_hidden_state
    analysed = model(ids, return_attention=True, **kw)
    torch.testing.assert_close(analysed.last_hidden_state, plain, atol=1e-5, rtol=1e-4)
    assert len(analysed.attentions) == model.config.n_layers or kw


def test_cross_attention_ignores_masked_memory_and_caches_it():
    cfg = ModelConfig(d_model=D, n_heads=H)
    attn = _init(Attention(cfg, cross=True)).eval()
    x, memory = torch.randn(1, 3, D), torch.randn(1, 6, D)
    keep = torch.tensor([[1, 1, 1, 1, 0, 0]]).bool()
    bias = torch.where(keep, 0.0, torch.finfo(torch.float32).min)[:, None, None, :]
    out = attn(x, _ctx(3, memory=memory, cross_bias=bias), 0)[0]
    noisy = memory.clone()
    noisy[:, 4:] = torch.randn(1, 2, D)
    torch.testing.assert_close(attn(x, _ctx(3, memory=noisy, cross_bias=bias), 0)[0], out)
    cache = KVCache()
    attn(x, _ctx(3, memory=memory, cross_bias=bias, cache=cache), 0)
    again = attn(x, _ctx(3, memory=torch.zeros_like(memory), cross_bias=bias, cache=cache), 0)[0]
    torch.testing.assert_close(again, out)  # the encoder's keys and values come from the cache


def test_linformer_with_identity_projections_is_full_attention():
    cfg = ModelConfig(d_model=D, n_heads=H, attention="linformer", max_seq_len=T, linformer_k=T)
    lin = _init(Attention(cfg, "linformer")).eval()
    full = Attention(cfg.replace(attention="full")).eval()
    full.load_state_dict({k: v for k, v in lin.state_dict().items() if "linformer" not in k})
    with torch.no_grad():
        lin.linformer.E.copy_(torch.eye(T))
        lin.linformer.F.copy_(torch.eye(T))
    x = torch.randn(2, T, D)
    torch.testing.assert_close(lin(x, _ctx(), 0)[0], full(x, _ctx(), 0)[0], atol=1e-5, rtol=1e-4)


def test_longformer_global_projections_equal_to_local_ones_change_nothing():
    cfg = lmforge.tiny("longformer-base")
    model = lmforge.build(cfg).eval()
    plain = lmforge.build(cfg.replace(global_projections=False)).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "global_qkv" not in k})
    with torch.no_grad():
        for block in model.encoder.blocks:
            block.attn.global_qkv.load_state_dict(block.attn.qkv.state_dict())
    ids = torch.randint(0, 99, (2, 20))
    torch.testing.assert_close(model(ids).last_hidden_state, plain(ids).last_hidden_state,
                               atol=1e-5, rtol=1e-4)


def test_xl_relative_bias_depends_only_on_offset_and_segments():
    cfg = ModelConfig(d_model=D, n_heads=H, position="xl-relative", n_segments=0, dropout=0.0)
    xl = _init(XLRelativeBias(cfg)).eval()
    q = torch.randn(1, H, 1, 8).expand(1, H, T, 8)  # the same query and key at every position
    k = torch.randn(1, H, 1, 8).expand(1, H, T, 8)
    pos = torch.arange(T)
    shifted, same_k, bias = xl(q, k, XLNetContext(pos, pos))
    torch.testing.assert_close(shifted, q + xl.r_w_bias[:, None])  # the content term (q + u)·k: q shifted
    assert same_k is k
    bias = bias[0] / xl.scale
    torch.testing.assert_close(bias[:, 2, 5], bias[:, 6, 9])
    assert not torch.allclose(bias[:, 2, 5], bias[:, 5, 2])  # direction matters
    segments = (pos >= 4).long()[None]
    with_seg = xl(q, k, XLNetContext(pos, pos, segments=segments))[2][0] / xl.scale
    segment_term = with_seg - bias
    torch.testing.assert_close(segment_term[:, 1, 2], segment_term[:, 6, 8])  # both within a segment
    assert not torch.allclose(segment_term[:, 1, 2], segment_term[:, 1, 6])  # across segments


class CountingKernel:
    """A stub backend around a real one: counts the attention calls of a forward pass."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def heads(self, fused, n_heads, n_kv, dh):
        return self.inner.heads(fused, n_heads, n_kv, dh)

    def attend(self, q, k, v, bias, dropout_p, scale):
        self.calls += 1
        return self.inner.attend(q, k, v, bias, dropout_p, scale)

    def merge(self, out):
        return self.inner.merge(out)


def _stack_context(model, ids, mask):
    """A decoder's or encoder's stack, its input x and the model's own context for it (XLNet's with
    segment ids)."""
    stack = model.decoder if model.config.architecture == "decoder" else model.encoder
    x, positions = model._embed(model.embed, ids, None, None, 0)
    ctx = model._context(stack, x, positions, 0, mask.bool(), dense=True)
    if model.config.position == "xl-relative":
        ctx = XLNetContext(**vars(ctx), segments=(torch.arange(ids.shape[1]) >= 3).long().expand_as(ids))
    return stack, x, ctx


@pytest.mark.parametrize("name", ["bert-base", "llama-3.2-1b", "xlnet-base", "longformer-base", "linformer"])
def test_every_layer_attends_through_one_call_of_the_kernel_on_the_context(name):
    cfg = (ModelConfig(d_model=D, n_heads=H, n_layers=3, d_ff=64, vocab_size=99, attention="linformer",
                       max_seq_len=16, linformer_k=8) if name == "linformer" else lmforge.tiny(name))
    model = lmforge.build(cfg).eval()
    ids = torch.randint(1, 99, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0
    with torch.no_grad():
        stack, x, ctx = _stack_context(model, ids, mask)
        want, _, _ = stack(x.clone(), ctx)
        ctx.kernel = CountingKernel(ctx.kernel)
        got, _, _ = stack(x.clone(), ctx)
    assert ctx.kernel.calls == model.config.n_layers  # qkv -> positions -> cache -> kernel -> out
    torch.testing.assert_close(got, want)


def test_attention_output_is_the_kernels_output_projected():
    class ZeroKernel(CountingKernel):
        def attend(self, q, k, v, bias, dropout_p, scale):
            return torch.zeros_like(q), None

    attn = _init(Attention(ModelConfig(d_model=D, n_heads=H, position="rotary"))).eval()
    ctx = _ctx(kernel=ZeroKernel(_ctx().kernel))
    out, _ = attn(torch.randn(2, T, D), ctx, 0)
    torch.testing.assert_close(out, attn.out.bias.expand(2, T, D))  # nothing reaches `out` around the kernel


def test_longformer_global_projections_are_a_class_of_their_own_chosen_by_the_pattern():
    cfg = lmforge.tiny("longformer-base")
    assert cfg.global_projections
    model = lmforge.build(cfg)
    assert all(type(block.attn) is LongformerGlobalAttention for block in model.encoder.blocks)
    assert "encoder.blocks.0.attn.global_qkv.weight" in model.state_dict()  # checkpoint names as before
    plain = lmforge.build(cfg.replace(global_projections=False))
    assert all(type(block.attn) is Attention for block in plain.encoder.blocks)
    assert not hasattr(Attention(ModelConfig(d_model=D, n_heads=H), "longformer"), "global_qkv")
