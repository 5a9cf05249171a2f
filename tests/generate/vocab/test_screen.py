"""The screened greedy argmax: its bound holds, it returns the fp32 argmax, and generation is unchanged."""
import os

import pytest
import torch

import lmforge
from lmforge.generate.vocab import screen as vocab_screen
from lmforge.generate.vocab.projection import VocabProjection, _copies
from lmforge.generate.vocab.screen import GreedyScreen, Int8Matmul, ScreenTable, quantise_features
from lmforge.heads import attach


def _projection(V=3000, d=96, seed=0, bias=False):
    """A vocabulary projection with a shared offset and an outlier dimension, as trained embeddings have."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(V, d, generator=g) * 0.05 + torch.randn(d, generator=g) * 0.2
    W[:, 3] *= 20
    b = torch.randn(V, generator=g) * 0.1 if bias else None
    return W, b


def _features(N, d, seed=1, outlier=True):
    h = torch.randn(N, d, generator=torch.Generator().manual_seed(seed)) * 3
    if outlier:
        h[:, 7] *= 40
    return h


@pytest.mark.parametrize("levels", [127, 63])
def test_two_stage_quantisation_error_within_its_bound(levels):
    h = _features(4, 96)
    rows, a, ratio = quantise_features(h.clone(), levels)
    q1, q2 = rows.view(4, 2, 96).unbind(1)
    assert rows.abs().max() <= levels and torch.equal(rows, rows.round())
    error = (h.double() - a.double() / levels * (q1.double() + q2.double() / (2 * levels))).abs()
    assert (error <= a.double() * (1 / (2 * levels * 2 * levels) + 2.0 ** -22)).all()  # + fp32's rounding
    torch.testing.assert_close(ratio.double(), h.double().norm(dim=1, keepdim=True) / a.double())


@pytest.mark.parametrize("kind", vocab_screen.KINDS)
@pytest.mark.parametrize("levels", [127, 63])
@pytest.mark.parametrize("d, M", [(64, 6), (5, 2), (33, 130), (100, 2)])
def test_int8_matmul_is_exact(kind, levels, d, M):
    g = torch.Generator().manual_seed(d)
    q = torch.randint(-127, 128, (301, d), dtype=torch.int8, generator=g)
    # row scales as wide as a real table's (its scales over L 2L are ~1e-7)
    scale = (torch.rand(301, generator=g) + 0.5) * 2.0 ** torch.randint(-122, 10, (301,), generator=g)
    mm = Int8Matmul(q, scale, kinds=(kind,), levels=levels)
    if mm.kind is None:
        pytest.skip(f"no exact {kind} int8 kernel for {levels} levels in this build")
    x = torch.randint(-levels, levels + 1, (M, d), generator=g).float()
    x[0] = levels  # the extreme the int16 pair sums of a kernel without VNNI would saturate on
    # the integer sums exact, then one fp32 conversion and one fp32 product with the row's scale
    assert torch.equal(mm(x), (x.long() @ q.long().t()).float() * scale)


def test_int8_matmul_refuses_a_kernel_it_cannot_trust():
    # torch._int_mm gives wrong sums for a single column on some builds: the probe follows the kernel
    q = torch.randint(-127, 128, (50, 1), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    x = torch.randint(-127, 128, (3, 1), generator=torch.Generator().manual_seed(1))
    try:
        right = torch.equal(torch._int_mm(x.to(torch.int8), q.t()), (x @ q.long().t()).int())
    except RuntimeError:  # refused outright here
        right = False
    mm = Int8Matmul(q, torch.ones(50), kinds=("int_mm",))
    assert (mm.kind == "int_mm") == right
    if right:
        assert torch.equal(mm(x.float()), (x @ q.long().t()).float())


@pytest.fixture(params=vocab_screen.FEATURE_LEVELS, ids=lambda levels: f"{levels}-levels")
def feature_levels(request, monkeypatch):
    """Each features' precision the screen may settle on (63 where the kernel sums pairs in int16)."""
    monkeypatch.setattr(vocab_screen, "FEATURE_LEVELS", (request.param,))
    return request.param


def test_the_feature_term_of_the_bound_holds_where_it_is_tight(feature_levels):
    L, d = feature_levels, 64
    signs = torch.randint(0, 2, (50, d), generator=torch.Generator().manual_seed(0)).float() * 2 - 1
    W = torch.cat([signs, -signs])  # mean row 0, every weight +-1: int8 exactly, no weight error
    table = ScreenTable(W)
    if not table.usable:
        pytest.skip(f"no exact int8 kernel for {L} levels here")
    g = torch.Generator().manual_seed(1)
    k = torch.randint(-(L - 1), L, (1, d), generator=g).float()
    j = torch.randint(-(L - 2), L - 1, (1, d), generator=g).float()
    # each h_i sits 0.45 of a second-stage step off its levels, signed as token 0's weights: the
    # features' error lines up with W_0, the worst case of the bound's ||e|| ||Q_0|| term
    h = (k + (j + 0.45 * W[:1]) / (2 * L)) / L
    h[0, 0] = W[0, 0]  # the largest |h_i|: a = 1, on a level
    t, bound, _ = table.scores(h)
    exact = h.double() @ W.double().t()
    ratio = (exact - t.double()).abs() / bound.double()
    assert (ratio <= 1).all() and ratio[0, 0] > 0.5  # holds, and a term 4x too small would fail


@pytest.mark.parametrize("bias", [False, True])
def test_bound_holds_for_every_token(bias, feature_levels):
    W, b = _projection(bias=bias)
    table = ScreenTable(W, b)
    if not table.usable:
        pytest.skip(f"no exact int8 kernel for {feature_levels} levels here")
    assert table.levels == feature_levels
    h = _features(3, W.shape[1])
    t, bound, _ = table.scores(h)
    a = h.abs().amax(1, keepdim=True).double()
    exact = (h.double() @ (W.double() - table.center.double()).t())  # (N, V), h.c left out
    if b is not None:
        exact += b.double()
    assert ((exact - a * t.double()).abs() <= a * bound.double()).all()
    # and is not vacuous: few tokens per row stay candidates
    candidates = (t + bound >= (t - bound).amax(1, keepdim=True)).sum(1)
    assert int(candidates.max()) <= W.shape[0] // 100


@pytest.mark.parametrize("N", [1, 4])
@pytest.mark.parametrize("bias", [False, True])
def test_screen_returns_the_fp32_argmax(N, bias, feature_levels):
    W, b = _projection(bias=bias)
    screen = greedy_screen(torch.nn.Module(), W, b)
    if screen is None:
        pytest.skip(f"no exact int8 kernel for {feature_levels} levels here")
    for seed in range(20):
        h = _features(N, W.shape[1], seed=seed, outlier=seed % 2 == 0)
        expected = torch.nn.functional.linear(h, W, b).argmax(-1)
        assert torch.equal(screen(h), expected)
    assert screen.fallbacks == 0


def test_ties_go_to_the_lowest_id_as_argmax():
    # small integers: every score is exact in fp32 whatever the summation order, so ties are real
    g = torch.Generator().manual_seed(0)
    W = torch.randint(-3, 4, (500, 64), generator=g).float()
    h = torch.randint(-3, 4, (1, 64), generator=g).float()
    best = int((h @ W.t()).argmax())
    twin = 0 if best == W.shape[0] - 1 else W.shape[0] - 1
    W[twin] = W[best]  # two tokens with the same score
    expected = min(best, twin)
    assert int((h @ W.t()).argmax()) == expected
    screen = greedy_screen(torch.nn.Module(), W, None)
    assert int(screen(h)) == expected
    assert torch.equal(screen(torch.cat([h, h])), torch.tensor([expected, expected]))


@pytest.mark.parametrize("scale", [1e-30, 1e-12, 1.0, 1e12, 1e30])
def test_screen_is_exact_at_any_feature_scale(scale):
    W, b = _projection(V=800, bias=True)
    screen = greedy_screen(torch.nn.Module(), W, b)
    for seed in range(5):
        h = _features(2, W.shape[1], seed=seed) * scale
        expected = (h.double() @ W.double().t() + b.double()).argmax(-1)
        chosen = screen(h)
        assert chosen is None or torch.equal(chosen, expected)


def test_rows_of_tiny_or_equal_weights_keep_the_bound():
    W, _ = _projection(V=600)
    W[10] = W.mean(0)  # the centre itself: a zero row once centred
    W[11] = W.mean(0) + 1e-40  # a row within subnormals of the centre
    W[12] *= 1e-30
    table = ScreenTable(W)
    assert table.usable
    h = _features(3, W.shape[1])
    t, bound, _ = table.scores(h)
    a = h.abs().amax(1, keepdim=True).double()
    exact = h.double() @ (W.double() - table.center.double()).t()
    assert ((exact - a * t.double()).abs() <= a * bound.double()).all()


def test_falls_back_where_it_cannot_decide():
    W, _ = _projection(V=500)
    screen = greedy_screen(torch.nn.Module(), W, None)
    bad = _features(2, W.shape[1])
    bad[1, 0] = float("nan")
    assert screen(bad) is None and screen(torch.zeros(1, W.shape[1])) is None
    same = greedy_screen(torch.nn.Module(), torch.ones(vocab_screen.MAX_CANDIDATES + 10, 8), None)
    assert same(torch.randn(1, 8)) is None  # every token ties: too many to re-score
    for _ in range(10):
        same(torch.randn(1, 8))
    assert not same.active  # most calls fell back: the screen stops trying


def test_copies_are_cached_until_the_weights_change():
    W, _ = _projection(V=400)
    W = torch.nn.Parameter(W)
    head = torch.nn.Module()
    first = _copies(head, W, None)
    assert _copies(head, W, None) is first
    with torch.no_grad():
        W.mul_(1.5)  # an optimiser-style in-place update
    second = _copies(head, W, None)
    assert second is not first
    W.data[5, 2] += 1.0  # a write that bypasses the version counter
    third = _copies(head, W, None)
    assert third is not second
    W.data[[3, 7]] = W.data[[7, 3]]  # swapped rows: the same sum, other scores per token
    assert _copies(head, W, None) is not third
    h = _features(1, W.shape[1])
    assert torch.equal(greedy_screen(head, W, None)(h), (h @ W.detach().t()).argmax(-1))


def test_not_for_other_dtypes_or_devices():
    W, _ = _projection(V=400)
    assert greedy_screen(torch.nn.Module(), W.double(), None) is None
    assert isinstance(greedy_screen(torch.nn.Module(), W, None), GreedyScreen)


def greedy_screen(_, weight, bias):
    """A screen over (weight, bias), or None where it does not apply (as the projection builds it)."""
    if weight.dtype != torch.float32:
        return None
    table = ScreenTable(weight, bias)
    return GreedyScreen(table, weight, bias) if table.usable else None


def _model(name="gpt2", vocab=1200):
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny(name).replace(vocab_size=vocab)).eval()
    attach(model, "lm")
    with torch.no_grad():  # tokens well apart, as after training: greedy then has clear winners
        model.tokens.weight.normal_(0, 0.5)
        if model.heads["lm"].bias is not None:
            model.heads["lm"].bias.normal_(0, 0.5)
    return model


def _both(model, ids, **kwargs):
    if model.config.architecture == "encoder-decoder":
        kwargs.setdefault("decoder_start_token_id", 0)
    screened = lmforge.generate(model, ids, max_new_tokens=12, projection="screen", **kwargs)
    plain = lmforge.generate(model, ids, max_new_tokens=12, projection="plain", **kwargs)
    return screened, plain


@pytest.mark.parametrize("name", ["gpt2", "t5-small", "bart-base", "llama-3.2-1b"])
def test_generation_gives_the_same_tokens_in_every_family(name):
    model = _model(name)
    ids = torch.randint(10, 1200, (3, 7), generator=torch.Generator().manual_seed(0))
    screened, plain = _both(model, ids)
    assert torch.equal(screened, plain)


@pytest.mark.parametrize("kwargs", [{}, {"repetition_penalty": 1.3}, {"min_new_tokens": 5, "eos_token_id": 3},
                                    {"suppress_tokens": [5, 6]}])
def test_generation_gives_the_same_tokens_with_processors(kwargs):
    model = _model()
    ids = torch.randint(10, 1200, (3, 7), generator=torch.Generator().manual_seed(0))
    screened, plain = _both(model, ids, **kwargs)
    assert torch.equal(screened, plain)


def test_auto_considers_the_screen_from_the_second_greedy_call_and_keeps_the_fastest(monkeypatch):
    from lmforge.generate.vocab import projection

    model = _model()
    monkeypatch.setattr(projection, "CHOICES", {})
    timed = []
    original = VocabProjection._fastest
    monkeypatch.setattr(VocabProjection, "_fastest",
                        lambda self, ways, h: timed.append(sorted(ways)) or original(self, ways, h))
    ids = torch.randint(10, 1200, (1, 5), generator=torch.Generator().manual_seed(1))
    first = lmforge.generate(model, ids, max_new_tokens=8)  # "auto": no table yet
    assert timed == [["input-major", "plain"]]
    assert torch.equal(lmforge.generate(model, ids, max_new_tokens=8), first)
    assert timed[1] == ["input-major", "plain", "screen"]  # the second greedy call times the screen too
    assert torch.equal(lmforge.generate(model, ids, max_new_tokens=8), first)
    assert len(timed) == 2  # decided once per shape on this machine
    lmforge.generate(model, ids, max_new_tokens=8, repetition_penalty=1.2)  # every score needed: no screen
    lmforge.generate(model, ids, max_new_tokens=2)  # too few steps to repay a copy or a timing
    assert [ways for ways in timed[2:] if "screen" in ways] == []


def test_a_screen_that_loses_is_not_built_again(monkeypatch):
    from lmforge.generate.vocab import projection

    model = _model()
    monkeypatch.setattr(projection, "CHOICES", {})
    monkeypatch.setattr(VocabProjection, "_fastest", lambda self, ways, h: "plain")
    built = []
    monkeypatch.setattr(projection, "ScreenTable", lambda *a: built.append(1) or ScreenTable(*a))
    ids = torch.randint(10, 1200, (1, 5), generator=torch.Generator().manual_seed(1))
    for _ in range(4):
        lmforge.generate(model, ids, max_new_tokens=8)
    assert len(built) == 1  # built for the second call's timing, then never again


def test_not_under_autocast_or_with_bf16_features():
    model = _model()
    ids = torch.randint(10, 1200, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = lmforge.generate(model, ids, max_new_tokens=6, projection="screen")
        assert torch.equal(out, lmforge.generate(model, ids, max_new_tokens=6, projection="plain"))
    W, _ = _projection(V=400)
    screen = greedy_screen(torch.nn.Module(), W, None)
    assert screen(_features(1, W.shape[1]).bfloat16()) is None


def test_projection_mode_is_checked():
    model = _model()
    with pytest.raises(ValueError, match="projection"):
        lmforge.generate(model, torch.tensor([[5, 6]]), max_new_tokens=2, projection="sometimes")


def test_a_cpu_without_vnni_gets_7_bit_feature_stages_from_fbgemm():
    import json
    import subprocess
    import sys

    with open("/proc/cpuinfo") as f:
        avx2 = "avx2" in f.read()
    if "fbgemm" not in torch.backends.quantized.supported_engines or not avx2:
        pytest.skip("needs fbgemm on an AVX2 CPU")
    code = ("import json, torch; from lmforge.generate.vocab.screen import Int8Matmul, ScreenTable; "
            "q = torch.randint(-127, 128, (500, 96), dtype=torch.int8); "
            "t = ScreenTable(torch.randn(500, 96)); "
            "print(json.dumps([[L, Int8Matmul(q, torch.ones(500), ('fbgemm',), L).kind] for L in (127, 63)] "
            "+ [t.levels, t.matmul.kind, t.usable, t.kinds_ms]))")
    capped = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",  # an AVX2 CPU's kernels
              "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
              # no native int8 library: its AVX2 build (seconds of gcc) would only join the timing race
              "LMFORGE_NATIVE": "off"}
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **capped}, capture_output=True,
                         text=True, timeout=120, check=False)
    seven, eight, levels, kind, usable, times = json.loads(out.stdout or "null") or (None,) * 6
    assert seven == [127, None] and eight == [63, "fbgemm"], out.stderr[-500:]  # int16 pair sums: 7 bits
    assert usable and kind == min(times, key=times.get) and "fbgemm" in times  # the fastest exact kind
    assert kind != "fbgemm" or levels == 63  # at the levels it sums exactly


def test_w8a32_sums_only_where_fp32_holds_every_partial_sum_exactly():
    from lmforge.quant import native

    if native.library() is None:
        pytest.skip("the native library is not built here")
    for d, exact in ((1040, True), (1041, False)):  # 1040 x 127 x 127 < 2^24 <= 1041 x 127 x 127
        q = torch.randint(-127, 128, (70, d), dtype=torch.int8, generator=torch.Generator().manual_seed(d))
        assert (Int8Matmul(q, torch.ones(70), kinds=("w8a32",)).kind == "w8a32") == exact
