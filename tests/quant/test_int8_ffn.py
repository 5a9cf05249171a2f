"""quant/int8_ffn and native.act_quantise_rows: an int8 FFN's hidden units made and quantised in one pass."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.modules.module import register_module_forward_hook

import lmforge
from lmforge.compress.quantize import quantize
from lmforge.layers.feedforward import FeedForward
from lmforge.quant import engines, int8, int8_ffn, native
from lmforge.quant.int8 import Int8Linear

pytestmark = pytest.mark.skipif(native.library() is None or not engines.u8_usable(),
                                reason="the native kernel or oneDNN's int8 product is not here")
ACT = {"relu": F.relu, "gelu": F.gelu}


def _acc(rows=300, cols=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=g) * 2, torch.rand(rows, 1, generator=g) + 0.5,
            torch.randn(cols, generator=g), torch.rand(cols, generator=g) + 0.5)


def test_the_fused_gelu_is_within_its_bound_of_the_exact_one():
    v = torch.linspace(-12, 12, 60001).view(-1, 1)  # one value a row: the row's peak is |GELU(v)|
    _, peak = native.act_quantise_rows(v, torch.ones(60001, 1), None, "gelu", None, 127, 128)
    exact = F.gelu(v.double()).abs().clamp(min=1e-30)
    assert ((peak.double() - exact).abs() <= 3e-7 * v.double().abs() + 1e-12).all()
    _, peak = native.act_quantise_rows(v, torch.ones(60001, 1), None, "relu", None, 127, 128)
    assert torch.equal(peak, F.relu(v).clamp(min=1e-30))


@pytest.mark.parametrize("act", ["relu", "gelu", "none"])
@pytest.mark.parametrize("levels", [63, 127])
def test_the_bytes_are_the_unfused_steps_bytes_but_at_a_rounding_boundary(act, levels):
    acc, rowscale, bias, inv = _acc()
    for b, i in ((bias, None), (None, inv), (bias, inv), (None, None)):  # each case has a loop of its own
        q, peak = native.act_quantise_rows(acc, rowscale, b, act, i, levels, levels + 1)
        h = acc * rowscale if b is None else torch.addcmul(b, acc, rowscale)
        q_ref, peak_ref = native.quantise_rows(ACT[act](h) if act in ACT else h, i, levels, levels + 1)
        assert ((peak - peak_ref).abs() <= 1e-6 * peak_ref).all()
        steps = (q.int() - q_ref.int()).abs()
        assert int(steps.max()) <= 1 and int(steps.sum()) <= 1e-3 * steps.numel()


def test_rows_are_independent_of_their_batch_and_of_the_thread_count():
    acc, rowscale, bias, _ = _acc(rows=1500, cols=64)  # over the size split between threads
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        q, peak = native.act_quantise_rows(acc, rowscale, bias, "gelu", None, 127, 128)
    finally:
        torch.set_num_threads(threads)
    for i in (0, 777, 1499):
        one = native.act_quantise_rows(acc[i:i + 1], rowscale[i:i + 1], bias, "gelu", None, 127, 128)
        assert torch.equal(one[0][0], q[i]) and torch.equal(one[1][0], peak[i])


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_a_non_finite_value_or_row_scale_makes_its_row_nan_and_no_other(act):
    acc, rowscale, bias, _ = _acc()
    acc[2, 7], acc[4, 0], rowscale[9] = float("nan"), float("-inf"), float("nan")
    q, peak = native.act_quantise_rows(acc, rowscale, bias, act, None, 63, 64)
    bad = [2, 4, 9] if act == "gelu" else [2, 9]  # ReLU(-inf) is 0: that row is finite
    assert [r for r in range(len(peak)) if not peak[r].isfinite()] == bad
    assert all((q[r] == 64).all() for r in bad)


def test_an_argument_the_c_code_would_misread_is_refused():
    acc, rowscale, bias, inv = _acc()
    cases = {"act": dict(act="tanh"), "acc": dict(acc=acc.double()), "rowscale": dict(rowscale=rowscale[:-1]),
             "bias": dict(bias=bias[:-1]), "inv": dict(inv=inv.half())}
    for name, change in cases.items():
        args = dict(acc=acc, rowscale=rowscale, bias=bias, act="gelu", inv=None, levels=127, zp=128) | change
        with pytest.raises(ValueError, match=f"^{name}"):
            native.act_quantise_rows(**args)


def _int8_ffn(ffn_name="gelu", d=48, d_ff=160, smooth=False):
    """(an FFN whose Linears are dynamic Int8Linears, the fp32 FFN it was quantised from)."""
    torch.manual_seed(0)
    cfg = lmforge.ModelConfig(vocab_size=50, d_model=d, n_layers=1, n_heads=4, d_ff=d_ff, ffn=ffn_name)
    ffn, fp32 = FeedForward(cfg).eval(), FeedForward(cfg).eval()
    fp32.load_state_dict(ffn.state_dict())
    for name in ("up", "gate", "down"):
        if getattr(ffn, name) is not None:
            factors = torch.rand(getattr(ffn, name).in_features) + 0.5 if smooth else None
            setattr(ffn, name, Int8Linear.from_linear(getattr(ffn, name), "dynamic", smooth=factors))
    return ffn, fp32


@pytest.fixture
def fresh_choices(monkeypatch):
    monkeypatch.setattr(int8, "CHOICES", {})
    monkeypatch.setattr(int8_ffn, "CHOICES", {})
    monkeypatch.setattr(int8_ffn, "TIMINGS", {})


@pytest.mark.parametrize("smooth", [False, True])
def test_the_fused_route_agrees_with_the_plain_one_and_with_fp32(fresh_choices, smooth):
    ffn, fp32 = _int8_ffn(smooth=smooth)
    x = torch.randn(2, 50, 48)
    with torch.no_grad():
        for layer in (ffn.up, ffn.down):  # both layers on onednn-u8, as the fused route multiplies
            int8.CHOICES[layer.key(100)] = engines.U8
        fused = int8_ffn.fused(ffn, x.view(100, 48))
        plain, reference = ffn(x).view(100, 48), fp32(x).view(100, 48)
    assert (fused - plain).norm() <= 1e-3 * plain.norm()  # the same bytes but a few, one step apart
    assert (fused - reference).norm() <= 0.05 * reference.norm()


@pytest.mark.skipif(not engines.vnni_usable(), reason="no AVX-512 VNNI here")
@pytest.mark.parametrize("kinds", [(engines.VNNI, engines.VNNI), (engines.VNNI + int8.SERIAL, engines.U8)])
def test_the_fused_route_multiplies_on_the_kernel_each_layer_chose(fresh_choices, monkeypatch, kinds):
    """A text's few rows: where a layer chose "u8-vnni", the fused route multiplies its bytes there too
    (the same bytes, the same sums to fp32 rounding)."""
    ffn, _ = _int8_ffn()
    x = torch.randn(14, 48)
    for layer, kind in zip((ffn.up, ffn.down), kinds):
        int8.CHOICES[layer.key(14)] = kind
    ran = []
    for form in (engines.VnniWeight, engines.U8Weight):
        real = form.multiply
        monkeypatch.setattr(form, "multiply", lambda *a, real=real, form=form: ran.append(form) or real(*a))
    with torch.no_grad():
        fused = int8_ffn.fused(ffn, x)
        # up: the tiles; down: the tiles on the hidden bytes, or onednn-u8's multiply
        down = engines.VnniWeight if kinds[1] == engines.VNNI else engines.U8Weight
        assert ran == [engines.VnniWeight, down]
        plain = ffn(x)
    assert (fused - plain).norm() <= 1e-3 * plain.norm()


def test_the_route_is_measured_once_kept_and_run_from_the_first_call(fresh_choices):
    ffn, _ = _int8_ffn()
    x = torch.randn(2, 50, 48)
    with torch.no_grad():
        first = int8_ffn.fused_feedforward(ffn, x)
        (key, route), = int8_ffn.CHOICES.items()
        assert key == ("ffn-gelu", 48, 160, 512, torch.get_num_threads()) and route in int8_ffn.ROUTES
        assert set(int8_ffn.TIMINGS[key]) == {"plain", "fused"}
        assert int8_ffn.routes() == [{"ffn": "ffn-gelu", "d_model": 48, "d_ff": 160, "rows": 512,
                                      "threads": key[4], "route": route,
                                      "ms": {n: round(s * 1e3, 4) for n, s in int8_ffn.TIMINGS[key].items()}}]
        again = int8_ffn.fused_feedforward(ffn, x)
        expected = ffn(x) if route == "plain" else int8_ffn.fused(ffn, x.view(100, 48)).view(2, 50, 48)
    assert (first is None) == (route == "plain") and (again is None) == (route == "plain")
    if route == "fused":
        assert torch.equal(first, again) and torch.equal(first, expected)


def test_a_route_written_down_before_is_taken_untimed(fresh_choices, monkeypatch):
    """...under a name that carries the kernels the fused route may multiply on: a route written before
    u8-vnni existed is measured again, not read."""
    asked = []
    monkeypatch.setattr(int8_ffn.kernel_store, "recall", lambda key: asked.append(key) or "fused")
    ffn, _ = _int8_ffn()
    with torch.no_grad():
        out = int8_ffn.fused_feedforward(ffn, torch.randn(100, 48))
    assert out is not None and out.shape == (100, 48) and not int8_ffn.TIMINGS
    assert [key[-1] for key in asked if key[0].startswith("ffn-")] == ["fused+plain+onednn-u8+u8-vnni"]


def test_a_layer_on_serial_onednn_u8_keeps_its_form_after_a_plain_route(fresh_choices):
    """The plain route drops the onednn-u8 forms only of layers that run another kernel: one that chose
    "onednn-u8-serial" multiplies on that form itself."""
    ffn, _ = _int8_ffn()
    for layer, kind in ((ffn.up, engines.U8 + int8.SERIAL), (ffn.down, "fp32")):
        int8.CHOICES[layer.key(100)] = kind
        layer.form(engines.U8)
    int8_ffn._release(ffn, 100)
    assert engines.U8 in ffn.up._derived and engines.U8 not in ffn.down._derived


def test_a_route_written_down_that_no_longer_agrees_runs_plain(fresh_choices, monkeypatch):
    monkeypatch.setattr(int8_ffn.kernel_store, "recall", lambda key: "fused")
    monkeypatch.setattr(int8_ffn, "fused", lambda ffn, rows: torch.zeros(len(rows), ffn.down.out_features))
    ffn, _ = _int8_ffn()
    with torch.no_grad():
        assert int8_ffn.fused_feedforward(ffn, torch.randn(100, 48)) is None  # the caller's plain route
    assert list(int8_ffn.CHOICES.values()) == ["plain"]


@pytest.mark.parametrize("case", ["geglu", "gelu-tanh", "few rows", "training", "fp32 layers", "weight-only"])
def test_where_the_fused_route_does_not_apply_the_plain_one_runs(fresh_choices, case):
    ffn, plain = _int8_ffn(case if case in ("geglu", "gelu-tanh") else "gelu")
    x = torch.randn(8 if case == "few rows" else 100, 48, requires_grad=case == "training")
    if case == "fp32 layers":
        ffn = plain
    if case == "weight-only":
        ffn.up = Int8Linear.from_linear(plain.up, "weight-only")
    assert int8_ffn.fused_feedforward(ffn, x) is None and not int8_ffn.CHOICES


def test_a_quantised_model_runs_the_fused_route_when_optimized_only(fresh_choices, monkeypatch):
    torch.manual_seed(0)
    model = quantize(lmforge.build(lmforge.tiny("bert-base")).eval(), "dynamic")
    monkeypatch.setattr(int8_ffn.kernel_store, "recall", lambda key: "fused")
    calls = []
    fuse = native.act_quantise_rows
    monkeypatch.setattr(native, "act_quantise_rows", lambda *a: calls.append(1) or fuse(*a))
    ids = torch.randint(5, 90, (4, 30))
    lmforge.optimize(model)
    with torch.no_grad():
        fast = model(ids).last_hidden_state
        assert len(calls) == model.config.n_layers + 1  # each layer, and the written route's agreement check
        for key in list(int8.CHOICES):  # every layer on onednn-u8, the fused route's products
            int8.CHOICES[key] = engines.U8
        lmforge.optimize(model, enabled=False)
        slow = model(ids).last_hidden_state
    assert len(calls) == model.config.n_layers + 1 and (fast - slow).norm() <= 1e-3 * slow.norm()


@pytest.mark.parametrize("where", ["layer", "global"])
def test_a_hooked_layer_runs_the_plain_route(fresh_choices, where):
    ffn, _ = _int8_ffn()
    seen = []
    hook = lambda module, args, out: seen.append(out.shape)  # noqa: E731
    handle = (ffn.down.register_forward_hook if where == "layer" else register_module_forward_hook)(hook)
    try:
        with torch.no_grad():
            assert int8_ffn.fused_feedforward(ffn, torch.randn(100, 48)) is None
    finally:
        handle.remove()
    assert not seen and not int8_ffn.CHOICES  # the caller's plain route runs the hook


def test_rows_with_nothing_to_judge_by_run_plain_for_this_process_only(fresh_choices, monkeypatch):
    written = []
    monkeypatch.setattr(int8_ffn.kernel_store, "settle", lambda *a, **k: written.append(a) or a[1])
    ffn, _ = _int8_ffn()
    with torch.no_grad():
        assert int8_ffn.fused_feedforward(ffn, torch.full((100, 48), float("nan"))) is None
    assert list(int8_ffn.CHOICES.values()) == ["plain"] and not written and not int8_ffn.TIMINGS
    assert engines.U8 not in ffn.up._derived or int8.CHOICES[ffn.up.key(100)] == engines.U8  # no idle copy
