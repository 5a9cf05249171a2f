"""fast/native_attention.py: the native inference attention equals SDPA's on every layout it serves,
and an optimized model runs it only where it can (no gradient, fp32 CPU, padding-only masks)."""
import functools

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.fast import kernels, native_attention
from lmforge.fast.native_attention import attend_rows, supports, vector_width
from lmforge.fast.optimize import optimize
from lmforge.fast.paths import FastPaths

pytestmark = pytest.mark.skipif(vector_width() == 0, reason="no native attention here (no gcc, no libgomp in "
                                "torch, or a CPU without AVX2)")


def _rows(lengths, heads=4, kv_heads=4, dh=32, seed=0):
    """q (N, H, dh), k, v (N, Hkv, dh) as strided views of one fused projection, and the spans."""
    gen = torch.Generator().manual_seed(seed)
    fused = torch.randn(sum(lengths), (heads + 2 * kv_heads) * dh, generator=gen) * 2
    q, k, v = fused.split([heads * dh, kv_heads * dh, kv_heads * dh], dim=-1)
    lens = torch.tensor(lengths, dtype=torch.int64)
    return (q.unflatten(-1, (heads, dh)), k.unflatten(-1, (kv_heads, dh)), v.unflatten(-1, (kv_heads, dh)),
            lens.cumsum(0) - lens, lens)


def _sdpa(q, k, v, starts, lens, bias=None):
    """Each sequence by SDPA, (N, H, dh)."""
    out = torch.zeros(q.shape)
    for s, (first, n) in enumerate(zip(starts.tolist(), lens.tolist())):
        one = [t[first:first + n].transpose(0, 1) for t in (q, k, v)]
        groups = q.shape[1] // k.shape[1]
        one[1], one[2] = one[1].repeat_interleave(groups, 0), one[2].repeat_interleave(groups, 0)
        mask = None if bias is None else bias[s, :n]
        out[first:first + n] = F.scaled_dot_product_attention(*one, attn_mask=mask,
                                                              scale=q.shape[-1] ** -0.5).transpose(0, 1)
    return out


@pytest.mark.parametrize("lengths,heads,kv_heads,dh", [
    ([64, 64, 64], 12, 12, 32), ([128, 5, 1, 17, 0, 9], 4, 4, 64), ([3, 33, 70], 8, 2, 16),
    ([9, 100], 6, 6, 48), ([40], 2, 1, 128)])
def test_every_sequence_equals_sdpa(lengths, heads, kv_heads, dh):
    q, k, v, starts, lens = _rows(lengths, heads, kv_heads, dh)
    got = attend_rows(q, k, v, starts, lens, dh ** -0.5)
    torch.testing.assert_close(got, _sdpa(q, k, v, starts, lens), atol=2e-5, rtol=1e-5)


def test_a_key_bias_masks_keys_as_sdpa_does():
    q, k, v, starts, lens = _rows([20, 7, 31])
    bias = torch.zeros(3, 31)
    bias[0, 15:], bias[1, 3:5], bias[2, :] = torch.finfo(torch.float32).min, -2.5, 0.75
    got = attend_rows(q, k, v, starts, lens, 32 ** -0.5, key_bias=bias)
    torch.testing.assert_close(got, _sdpa(q, k, v, starts, lens, bias), atol=2e-5, rtol=1e-5)


def test_the_result_is_the_same_for_any_thread_count_and_rows_outside_sequences_are_left():
    q, k, v, _, _ = _rows([50, 30, 20], heads=4)
    starts, lens = torch.tensor([0, 60]), torch.tensor([50, 40])  # rows 50..59 belong to no sequence
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            outs.append(attend_rows(q, k, v, starts, lens, 0.2, out=torch.full(q.shape, 7.0)))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1]) and (outs[0][50:60] == 7.0).all()


def test_nan_stays_in_its_own_sequence_and_head():
    q, k, v, starts, lens = _rows([10, 12])
    q[3, 1, 5] = float("nan")
    out = attend_rows(q, k, v, starts, lens, 0.2)
    assert out[3, 1].isnan().all() and not out[:10, 0].isnan().any() and not out[10:].isnan().any()


def test_what_the_kernel_would_misread_is_refused_by_name():
    q, k, v, starts, lens = _rows([8, 8])
    with pytest.raises(ValueError, match="^q:"):
        attend_rows(q.double(), k, v, starts, lens, 1.0)
    with pytest.raises(ValueError, match="^starts, lengths:"):
        attend_rows(q, k, v, starts + 1, lens, 1.0)
    with pytest.raises(ValueError, match="^key_bias:"):
        attend_rows(q, k, v, starts, lens, 1.0, key_bias=torch.zeros(2, 4))
    assert not supports(24 if vector_width() == 16 else 12, torch.float32, torch.device("cpu"))
    assert not supports(32, torch.bfloat16, torch.device("cpu"))


def _encoder():
    torch.manual_seed(0)
    cfg = lmforge.ModelConfig(vocab_size=97, d_model=64, n_layers=2, n_heads=2, d_ff=96, max_seq_len=64,
                              dropout=0.0, attention_dropout=0.0)
    return lmforge.from_config(cfg).eval()


def _count_native(monkeypatch) -> list:
    calls = []
    real = kernels.attend_rows

    def counted(*args, **kw):
        calls.append(args[0].shape)
        return real(*args, **kw)

    monkeypatch.setattr(kernels, "attend_rows", counted)
    return calls


@pytest.mark.parametrize("layout", ["full", "key bias", "packed"])
def test_an_optimized_encoder_runs_it_in_inference_and_equals_the_plain_one(layout, monkeypatch):
    model, ids = _encoder(), torch.randint(1, 97, (24, 40))
    mask = torch.ones(24, 40, dtype=torch.long)
    if layout == "key bias":  # under 5 % padding: the padded layout with a key-padding bias
        mask[3, 35:] = 0
    elif layout == "packed":
        mask = (torch.arange(40)[None] < torch.randint(1, 41, (24, 1))).long()
    with torch.inference_mode():
        plain = model(ids, attention_mask=mask).last_hidden_state
        calls = _count_native(monkeypatch)
        fast = optimize(model)(ids, attention_mask=mask).last_hidden_state
    assert len(calls) == 2  # one call a layer, every sequence in it
    keep = mask.bool()
    torch.testing.assert_close(fast[keep], plain[keep], atol=1e-5, rtol=1e-5)


def test_a_gradient_or_the_switch_keeps_the_plain_kernels(monkeypatch):
    model, ids = _encoder(), torch.randint(1, 97, (4, 40))
    calls = _count_native(monkeypatch)
    optimize(model)
    with_grad = model(ids).last_hidden_state
    with torch.no_grad():
        off = optimize(model, paths=FastPaths(native_attention=False))(ids).last_hidden_state
    assert calls == [] and torch.equal(with_grad.detach(), off)


def test_the_avx2_build_equals_sdpa(tmp_path, monkeypatch):
    """The code an AVX2-only machine runs, built with the flags torch's AVX2 capability asks for: here, in
    this process (a process of its own under ATEN_CPU_CAPABILITY=avx2 spent seconds importing torch)."""
    monkeypatch.setenv("LMFORGE_NATIVE", str(tmp_path))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(native_attention, "library", functools.cache(native_attention.library.__wrapped__))
    q, k, v, s, n = _rows([64, 13, 1, 30], heads=6, kv_heads=3, dh=40)
    got = attend_rows(q, k, v, s, n, 40 ** -0.5)
    assert vector_width() == 8 and [p.suffix for p in tmp_path.iterdir()] == [".so"]
    torch.testing.assert_close(got, _sdpa(q, k, v, s, n), atol=2e-5, rtol=1e-5)


def test_a_transposed_mask_runs_as_the_plain_model_does(monkeypatch):
    """A column-major attention mask gives a strided key bias: copied, not refused."""
    model, ids = _encoder(), torch.randint(1, 97, (24, 40))
    mask = torch.ones(40, 24, dtype=torch.long).t()
    mask[3, 35:] = 0  # under 5 % padding: the padded layout
    with torch.inference_mode():
        plain = model(ids, attention_mask=mask).last_hidden_state
        calls = _count_native(monkeypatch)
        fast = optimize(model)(ids, attention_mask=mask).last_hidden_state
    assert len(calls) == 2
    torch.testing.assert_close(fast[mask.bool()], plain[mask.bool()], atol=1e-5, rtol=1e-5)


NATIVE_FAMILIES = {"bert-base", "albert-base", "distilbert-base", "electra-base", "roberta-base", "bart-base"}


def test_every_family_and_axis_with_the_kernel_equals_it_without(monkeypatch):
    """Heads of 16 on every preset and axis (the tiny ones have 8, under AVX-512's width): where the
    kernel runs, results equal SDPA's; it runs for the bidirectional full-attention encoders."""
    from tests.conftest import CASES, forward

    ids = torch.randint(3, 99, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(12)[None] < torch.tensor([[12], [9], [4]])).long()
    calls = _count_native(monkeypatch)
    ran = set()
    for name, cfg in CASES.items():
        torch.manual_seed(0)
        model = lmforge.build(cfg.replace(d_head=16)).eval()
        with torch.inference_mode():
            optimize(model, paths=FastPaths(native_attention=False))
            want = forward(model, ids, mask, decoder_mask=mask).last_hidden_state
            before = len(calls)
            small = FastPaths(small_calls_plain=False)  # 3 x 12 tokens: below the kernel's size otherwise
            got = forward(optimize(model, paths=small), ids, mask, decoder_mask=mask).last_hidden_state
        ran.update([name] if len(calls) > before else [])
        keep = mask.bool() if got.shape[:2] == mask.shape else slice(None)
        torch.testing.assert_close(got[keep], want[keep], atol=2e-5, rtol=1e-5, msg=name)
    assert NATIVE_FAMILIES <= ran, NATIVE_FAMILIES - ran


def test_autocast_and_attention_dropout_keep_the_paths_chosen_without_it(monkeypatch):
    """Decided once a pass: no native call (nor its per-call fallback) under autocast or dropout."""
    torch.manual_seed(0)
    cfg = lmforge.ModelConfig(vocab_size=97, d_model=64, n_layers=2, n_heads=2, d_ff=96, max_seq_len=64,
                              attention_dropout=0.1)
    model, ids = lmforge.from_config(cfg).eval(), torch.randint(1, 97, (6, 40))
    mask = (torch.arange(40)[None] < torch.tensor([[40], [33], [40], [12], [40], [39]])).long()
    calls = _count_native(monkeypatch)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = optimize(model)(ids, attention_mask=mask).last_hidden_state
        want = optimize(model, paths=FastPaths(native_attention=False))(
            ids, attention_mask=mask).last_hidden_state
    optimize(model).train()
    with torch.no_grad():
        model(ids, attention_mask=mask)
    assert calls == [] and torch.equal(got, want)


def test_a_pass_too_small_to_repay_the_kernel_attends_by_sdpa_unless_asked(monkeypatch):
    """Under NATIVE_MIN_QUERIES query rows x heads SDPA's lower cost a call wins (bert-tiny at batch 1 ran
    1.7x slower optimized): the same results either way, within float rounding."""
    from lmforge.fast.execution import NATIVE_MIN_QUERIES

    model, ids = _encoder(), torch.randint(1, 97, (1, 16))  # 1 x 16 x 2 heads
    assert ids.numel() * model.config.n_heads < NATIVE_MIN_QUERIES <= 16 * ids.numel() * model.config.n_heads
    calls = _count_native(monkeypatch)
    with torch.inference_mode():
        small = optimize(model)(ids).last_hidden_state
        assert calls == []
        forced = optimize(model, paths=FastPaths(small_calls_plain=False))(ids).last_hidden_state
        assert len(calls) == 2
        optimize(model)(ids.repeat(16, 1))
        assert len(calls) == 4  # 16 such texts: the kernel
    torch.testing.assert_close(small, forced, atol=1e-5, rtol=1e-5)
