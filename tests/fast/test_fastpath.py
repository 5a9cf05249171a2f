"""Every fast path equals the reference path it replaces (no timings here: see bench/)."""
import pytest
import torch

import lmforge
import lmforge.heads
from lmforge.fast.blocked import ChunkPlan, plan
from lmforge.fast.optimize import optimize
from lmforge.fast.paths import FastPaths
from lmforge.layers.attention import KVCache
from lmforge.model import StackPass
from tests.conftest import CASES, forward

LENGTHS = (13, 8, 3)


def _batch(vocab: int, lengths=LENGTHS, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), T), generator=gen)
    return ids, (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()


def _run(model, fast: FastPaths, ids, mask, **kw):
    optimize(model, paths=fast)
    return forward(model, ids, mask, decoder_mask=mask, **kw)


def assert_same_at_real_positions(a, b, mask):
    keep = mask.bool()
    torch.testing.assert_close(a[keep], b[keep], atol=1e-5, rtol=1e-4)


def _loss(hidden, mask):
    """A fixed random direction of the real positions' states (a norm-only loss has ~0 gradients)."""
    direction = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1))
    return (hidden * direction)[mask.bool()].sum()


def assert_same_gradients(ours: dict, ref: dict):
    """Equal within float rounding relative to each tensor's largest gradient."""
    assert ours.keys() == ref.keys()
    for name in ref:
        scale = max(float(ref[name].abs().max()), 1.0)
        torch.testing.assert_close(ours[name], ref[name], atol=1e-5 * scale, rtol=1e-4)


# every preset (encoders, decoders, encoder-decoders) and every axis on an encoder
UNPAD_CASES = [name for name in CASES if ":" not in name or name.startswith("encoder:")]


@pytest.mark.parametrize("name", UNPAD_CASES)
def test_unpadding_equals_the_padded_path(name):
    torch.manual_seed(0)
    model = lmforge.build(CASES[name]).eval()
    ids, mask = _batch(model.config.vocab_size)
    with torch.no_grad():
        padded = _run(model, FastPaths(unpad="never"), ids, mask, return_hidden=True)
        variants = ({"sequence_attention": False}, {"sequence_min_length": 0}, {"jagged_attention": "always"})
        for variant in variants:  # re-padded, sequence by sequence, one nested jagged call
            packed = _run(model, FastPaths(unpad="always", **variant), ids, mask, return_hidden=True)
            assert_same_at_real_positions(packed.last_hidden_state, padded.last_hidden_state, mask)
            for ours, ref in zip(packed.hidden_states, padded.hidden_states):
                assert_same_at_real_positions(ours, ref, mask)
            if padded.encoder_last_hidden_state is not None:
                assert_same_at_real_positions(packed.encoder_last_hidden_state,
                                              padded.encoder_last_hidden_state, mask)


def test_auto_unpads_when_padding_is_substantial():
    model = lmforge.build(lmforge.tiny("bert-base"))
    full = torch.ones(4, 10, dtype=torch.bool)
    half = torch.arange(10)[None].expand(4, 10) < 5
    assert model._packing(half, None, None) is None  # the plain model never packs
    optimize(model)
    assert model._packing(full, None, None) is None
    assert model._packing(half, None, None).n_tokens == 20
    assert model._packing(half, KVCache(), None) is None  # decoding keeps the padded layout
    assert model._packing(half, None, None, keep_padding=True) is None  # a per-token head reads them
    assert not model._heads_read(run_heads=True)["keep_padding"]  # a bare encoder: hidden states only
    lmforge.heads.attach(model, "lm")
    assert model._heads_read(run_heads=True)["keep_padding"]
    assert not model._heads_read(run_heads=False)["keep_padding"]
    optimize(model, paths=FastPaths(unpad="never"))
    assert model._packing(half, None, None) is None
    with pytest.raises(ValueError, match="unpad"):
        FastPaths(unpad="sometimes")


def test_training_unpads_at_any_padding_and_re_pads_attention_under_dropout():
    model = optimize(lmforge.build(lmforge.tiny("bert-base", attention_dropout=0.1)))
    slight = torch.arange(20)[None].expand(4, 20) < torch.tensor([[20], [20], [20], [19]])  # 1.25 % padding
    assert model.eval()._packing(slight, None, None) is None  # inference: not worth re-padding
    packing = model.train()._packing(slight, None, None)
    assert packing.n_tokens == 79 and not packing.by_sequence  # SDPA with dropout: one padded call
    model = optimize(lmforge.build(lmforge.tiny("bert-base", attention_dropout=0.0))).train()
    assert model._packing(slight, None, None).by_sequence


def test_short_batches_attend_re_padded_and_long_ones_sequence_by_sequence():
    model = optimize(lmforge.build(lmforge.tiny("bert-base")).eval(), paths=FastPaths(unpad="always"))
    execution = model.execution
    for lengths, by_sequence in (((31, 8, 3), False), ((32, 8, 3), True)):
        mask = _batch(model.config.vocab_size, lengths)[1].bool()
        assert execution.packing(model, mask, None, None, False).by_sequence is by_sequence
    with pytest.raises(ValueError, match="sequence_min_length"):
        FastPaths(sequence_min_length=-1)


def test_unpadded_gradients_equal_padded_gradients():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base"), dropout=0.0, attention_dropout=0.0)
    ids, mask = _batch(model.config.vocab_size)
    grads = []
    paths = (FastPaths(unpad="never"), FastPaths(unpad="always"),
             FastPaths(unpad="always", sequence_min_length=0),
             FastPaths(unpad="always", jagged_attention="always"))
    for fast in paths:
        model.zero_grad()
        hidden = _run(model, fast, ids, mask).last_hidden_state
        _loss(hidden, mask).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert_same_gradients(grads[1], grads[0])
    assert_same_gradients(grads[2], grads[0])
    assert_same_gradients(grads[3], grads[0])


_BASE = dict(vocab_size=99, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=128, window=8,
             block_size=4)
BLOCKED_CASES = {
    "sliding": dict(attention="sliding-window"),
    "sliding-causal": dict(architecture="decoder", attention="sliding-window"),
    "sliding-wide": dict(attention="sliding-window", window=20),
    "dilated": dict(attention="dilated", dilation=2),
    "dilated-causal": dict(architecture="decoder", attention="dilated", dilation=3, window=4),
    "longformer": dict(attention="longformer", n_global_tokens=2),
    "longformer-projections": dict(attention="longformer", global_projections=True),
    "window-schedule": dict(attention="longformer", window_schedule=[4, 12]),
    "bigbird": dict(attention="bigbird", n_random_blocks=2),
    "bigbird-first": dict(attention="bigbird", random_block_choice="first"),
    "gqa-alibi": dict(attention="sliding-window", n_kv_heads=2, position="alibi"),
    "relative-bias": dict(attention="sliding-window", position="relative-bias", relative_buckets=8,
                          relative_max_distance=16),
    "rotary-causal": dict(architecture="decoder", attention="sliding-window", position="rotary"),
    "schedule-mixed": dict(n_layers=3, attention_schedule=["sliding-window", "full", "dilated"], dilation=2),
}


def _global_tokens(ids):
    glob = torch.zeros_like(ids, dtype=torch.bool)
    glob[:, 0] = True
    glob[0, 40] = glob[1, 7] = True  # differs by row, inside and outside the first chunk
    return glob


@pytest.mark.parametrize("name", list(BLOCKED_CASES))
def test_blocked_local_attention_equals_the_dense_mask(name):
    torch.manual_seed(0)
    cfg = lmforge.ModelConfig(**{**_BASE, **BLOCKED_CASES[name]})
    model = lmforge.build(cfg).eval()
    ids, mask = _batch(99, lengths=(61, 45, 20))  # 61: not a multiple of any chunk or block
    kw = {"global_tokens": _global_tokens(ids)} if "longformer" in str(cfg.layer_patterns()) else {}
    with torch.no_grad():
        dense = _run(model, FastPaths(unpad="never", local_attention="dense"), ids, mask, **kw)
        blocked = _run(model, FastPaths(unpad="never", local_attention="blocked"), ids, mask, **kw)
        both = _run(model, FastPaths(unpad="always", local_attention="blocked"), ids, mask, **kw)
    assert_same_at_real_positions(blocked.last_hidden_state, dense.last_hidden_state, mask)
    assert_same_at_real_positions(both.last_hidden_state, dense.last_hidden_state, mask)


@pytest.mark.parametrize("name", ["sliding-causal", "dilated", "longformer", "bigbird", "relative-bias"])
def test_blocked_gives_queries_that_see_no_key_the_dense_values(name):
    """A padded query with no real key in its band, and every query of a row of padding only, attend
    uniformly to all T keys on the dense path, not to their band's: a per-token head reads those rows and
    a decoder cross-attends to them."""
    torch.manual_seed(0)
    cfg = lmforge.ModelConfig(**{**_BASE, **BLOCKED_CASES[name]})
    model = lmforge.build(cfg).eval()
    ids, mask = _batch(99, lengths=(61, 20, 0))
    kw = {"global_tokens": _global_tokens(ids)} if "longformer" in str(cfg.layer_patterns()) else {}
    with torch.no_grad():
        dense = _run(model, FastPaths(unpad="never", local_attention="dense"), ids, mask, **kw)
        blocked = _run(model, FastPaths(unpad="never", local_attention="blocked"), ids, mask, **kw)
    torch.testing.assert_close(blocked.last_hidden_state, dense.last_hidden_state, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", list(BLOCKED_CASES))
def test_without_padding_every_query_sees_a_key(name):
    """The plan builds its blind-query mask only from padding: the invariant that lets it, each pattern's
    band holding every query's own key, checked on every layer's plan at a length no chunk divides."""
    cfg = lmforge.ModelConfig(**{**_BASE, **BLOCKED_CASES[name]})
    causal, T = cfg.architecture == "decoder", 61
    pos, glob = torch.arange(T), _global_tokens(torch.zeros(2, T, dtype=torch.long))
    for layer, pattern in enumerate(cfg.layer_patterns()):
        if pattern not in ("sliding-window", "dilated", "longformer", "bigbird"):
            continue
        p = plan(cfg, pattern, pos, pos, causal, layer, None, glob if pattern == "longformer" else None,
                 None, torch.float32)
        scores = p.bias.amax(-1).amax(2).flatten(1)[:, :T]  # (B|1, T): each query's best candidate
        assert p.blind is None and bool((scores > torch.finfo(torch.float32).min / 2).all())


@pytest.mark.parametrize("case", [dict(attention="sliding-window", window=128),
                                  dict(attention="bigbird", block_size=64, n_random_blocks=3)])
def test_blocked_equals_dense_at_long_lengths(case):
    # the sizes the patterns are used at: hundreds of tokens, a 128 window, 64-token blocks (T=70 above
    # covers only a few chunks); d_model stays tiny so the dense reference is cheap
    torch.manual_seed(0)
    cfg = lmforge.ModelConfig(vocab_size=99, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_seq_len=1024,
                              **case)
    model = lmforge.build(cfg).eval()
    ids, mask = _batch(99, lengths=(650, 601))  # neither a multiple of 64 or of the chunk
    with torch.no_grad():
        dense = _run(model, FastPaths(unpad="never", local_attention="dense"), ids, mask)
        blocked = _run(model, FastPaths(unpad="never", local_attention="blocked"), ids, mask)
    assert_same_at_real_positions(blocked.last_hidden_state, dense.last_hidden_state, mask)
    ctx = model._context(model.encoder, torch.zeros(1, 650, 16), torch.arange(650)[None], 0, None)
    plans = [v for k, v in ctx.biases.items() if k.split("@")[0] == case["attention"]]  # bigbird: per layer
    assert plans and all(isinstance(p, ChunkPlan) for p in plans)  # auto takes the blocked path here too


@pytest.mark.parametrize("pattern", ["longformer", "sliding-window"])  # gathered extra keys; band views only
def test_blocked_gradients_equal_dense_gradients(pattern):
    torch.manual_seed(0)
    cfg = lmforge.ModelConfig(**_BASE, attention=pattern, dropout=0.0, attention_dropout=0.0)
    model = lmforge.build(cfg)
    ids, mask = _batch(99, lengths=(50, 31))
    grads = []
    for local in ("dense", "blocked"):
        model.zero_grad()
        hidden = _run(model, FastPaths(local_attention=local), ids, mask).last_hidden_state
        _loss(hidden, mask).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert_same_gradients(grads[1], grads[0])


def test_auto_blocks_long_sequences_only():
    cfg = lmforge.ModelConfig(**_BASE, attention="sliding-window")
    model = optimize(lmforge.build(cfg))
    for T, blocked in ((16, False), (24, False), (25, True), (100, True)):  # band 16 + 4 + 4 = 24 keys
        x = torch.zeros(1, T, 32)
        ctx = model._context(model.encoder, x, torch.arange(T)[None], 0, None)
        assert isinstance(ctx.biases["sliding-window"], ChunkPlan) == blocked
    ctx = model._context(model.encoder, x, torch.arange(T)[None], 0, None, StackPass(return_attention=True))
    assert not isinstance(ctx.biases["sliding-window"], ChunkPlan)  # attention maps need the dense path


@pytest.mark.parametrize("pattern", ["sliding-window", "bigbird"])
def test_blocked_plan_grows_linearly_with_length(pattern):
    cfg = lmforge.ModelConfig(**{**_BASE, "max_seq_len": 4096, "window": 64, "block_size": 16},
                              attention=pattern)
    sizes = []
    for T in (1024, 2048, 4096):
        pos = torch.arange(T)
        p = plan(cfg, pattern, pos, pos, False, 0, None, None, None, torch.float32)
        sizes.append(p.bias.numel() + p.keys.numel() + (p.rows_bias.numel() if p.rows is not None else 0))
    assert sizes[1] <= 2.05 * sizes[0] and sizes[2] <= 2.05 * sizes[1]


def test_kv_cache_preallocates_and_equals_concatenation():
    cache, steps = KVCache(), [torch.randn(2, 3, t, 4) for t in (5, 1, 1, 1, 60, 1)]
    want_k = want_v = None
    pointers = []
    for k in steps:
        v = k * 2
        got_k, got_v = cache.extend(0, k, v)
        want_k = k if want_k is None else torch.cat([want_k, k], 2)
        want_v = v if want_v is None else torch.cat([want_v, v], 2)
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
        pointers.append(got_k.data_ptr())
    assert len(set(pointers[:4])) == 1 and pointers[4] != pointers[3]  # one buffer until it is full
    assert cache.length == want_k.shape[2]
    cache.reorder(torch.tensor([1, 0]))  # beam search swaps rows: the next step sees them swapped
    k = torch.randn(2, 3, 1, 4)
    got_k, _ = cache.extend(0, k, k)
    assert torch.equal(got_k, torch.cat([want_k[[1, 0]], k], 2))


def test_kv_cache_keeps_autograd_intact():
    cache = KVCache()
    k = torch.randn(1, 2, 3, 4, requires_grad=True)
    out, _ = cache.extend(0, k, k)
    out2, _ = cache.extend(0, k * 2, k)
    out2.sum().backward()
    torch.testing.assert_close(k.grad, torch.full_like(k, 3.0))


@pytest.mark.parametrize("name", ["bert-base", "longformer-base", "gpt2"])
def test_bf16_autocast_runs_every_fast_path_close_to_fp32(name):
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny(name), max_seq_len=128).eval()  # tiny's window (8) kept: longformer's
    optimize(model, paths=FastPaths(unpad="always", local_attention="blocked"))
    ids, mask = _batch(model.config.vocab_size, lengths=(70, 40, 12))
    with torch.no_grad():
        want = model(ids, mask).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = model(ids, mask).last_hidden_state
    keep = mask.bool()
    assert got.dtype in (torch.bfloat16, torch.float32) and torch.isfinite(got).all()
    scale = want[keep].abs().mean()
    assert (got[keep].float() - want[keep]).abs().mean() < 0.05 * scale


def test_unpadded_causal_attention_sequence_by_sequence_with_left_padding():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("gpt2")).eval()
    ids, mask = _batch(model.config.vocab_size)
    mask = mask.flip(1)  # left padding, as generation prompts come
    x = torch.zeros(3, ids.shape[1], model.config.d_model)
    ctx = model.decoder.context(x, torch.arange(ids.shape[1])[None], 0, mask.bool())
    assert ctx.padding_only == {"full": True}  # causal full attention: packed rows need no re-padding
    with torch.no_grad():
        padded = _run(model, FastPaths(unpad="never"), ids, mask).last_hidden_state
        for by_sequence in (False, True):
            packed = _run(model, FastPaths(unpad="always", sequence_attention=by_sequence,
                                           sequence_min_length=0), ids, mask)
            assert_same_at_real_positions(packed.last_hidden_state, padded, mask)


@pytest.mark.parametrize("ffn", ["relu", "gelu", "gelu-tanh", "geglu", "swiglu"])
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_inference_writes_activations_and_residuals_in_place_with_the_same_results(ffn, placement):
    from lmforge.fast.optimize import IN_PLACE, optimized_for
    from lmforge.layers.feedforward import ACTIVATIONS

    assert {act for act, _ in ACTIVATIONS.values()} <= set(IN_PLACE)  # no activation falls back
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base", ffn=ffn, norm_placement=placement)).eval()
    ids, mask = _batch(model.config.vocab_size)
    # no_grad would run it, autograd not
    optimize(model, paths=FastPaths(unpad="never", native_attention=False))
    # in place: nothing keeps the sublayers' outputs for a backward
    with torch.no_grad(), optimized_for(model):
        in_place = model(ids, mask, return_hidden=True)
    with optimized_for(model):
        autograd = model(ids, mask, return_hidden=True)  # parameters require grad: out of place
    assert autograd.last_hidden_state.requires_grad
    assert torch.equal(in_place.last_hidden_state, autograd.last_hidden_state.detach())
    for a, b in zip(in_place.hidden_states, autograd.hidden_states):  # kept states are not overwritten
        assert torch.equal(a, b.detach())
    autograd.last_hidden_state.sum().backward()
    assert all(p.grad is not None for p in model.encoder.parameters() if p.requires_grad)
