"""fast/route: a large output that dies in its layer goes where it was measured faster (oneDNN's fresh
tensor or the slot's reused buffer), with the same result within float rounding, measured once per
machine."""
import json

import pytest
import torch
import torch.nn.functional as F

from lmforge import optimize
from lmforge.fast import linear, route
from lmforge.fast.linear import NO_POST, FastLinear
from lmforge.quant import kernel_store
from lmforge.utils import timing
from tests.fast.ffn_cases import gelu_ffn

pytestmark = pytest.mark.skipif(not linear.ONEDNN, reason="this torch has no oneDNN linear")


@pytest.fixture
def small_outputs_mapped(monkeypatch):
    """Outputs of 1 KiB and more count as mapped afresh (the real bar is 32 MiB); no choice is known."""
    monkeypatch.setattr(route, "FRESH_MAP_BYTES", 1 << 10)
    monkeypatch.setattr(route, "SCRATCH_MIN_BYTES", 0)
    monkeypatch.setattr(linear, "SCRATCH_MIN_BYTES", 0)
    monkeypatch.setattr(route, "CHOICES", {})
    monkeypatch.setattr(route, "TIMINGS", {})
    monkeypatch.setattr(timing, "BUSY_SHARE", float("inf"))  # kept on any load (the rule has its own test)
    yield
    linear.release_scratch()


def _layer(slot="ffn.up") -> FastLinear:
    torch.manual_seed(0)
    layer = FastLinear(64, 96)
    layer.onednn, layer.small_plain, layer.packs, layer.slot = True, False, True, slot
    return layer


def _choose(x: torch.Tensor, choice: str, post: tuple = NO_POST, out: int = 96) -> None:
    route.CHOICES[route.key_of(x, out, (post[0], True))] = choice


def test_only_outputs_mapped_afresh_are_routed(monkeypatch):
    monkeypatch.setattr(route, "SCRATCH_MIN_BYTES", 1 << 24)  # glibc's, whatever allocator runs the tests
    x = torch.empty(0, 768)
    big, small = torch.empty(4096, 768), torch.empty(1024, 768)
    assert route.mapped_afresh(big, 3072)  # bert-base's 32 x 128 FFN hidden units: 48 MiB
    assert not route.mapped_afresh(small, 3072) and not route.mapped_afresh(x, 3072)  # 12 MiB; none
    assert route.key_of(torch.empty(3000, 768), 3072)[1:4] == (768, 3072, 4096)  # rows by power of two


@pytest.mark.parametrize("choice", ["scratch", "onednn"])
def test_either_route_equals_f_linear_and_scratch_reuses_the_buffer(small_outputs_mapped, choice):
    layer, x = _layer(), torch.randn(2, 40, 64)
    _choose(x, choice)
    with torch.no_grad():
        first, second = layer(x), layer(x)
        want = F.linear(x, layer.weight, layer.bias)
    torch.testing.assert_close(first, want, rtol=1e-5, atol=1e-5)
    same_buffer = first.data_ptr() == second.data_ptr()
    assert same_buffer == (choice == "scratch")


def test_a_layer_without_a_slot_hooked_or_with_grad_never_asks(small_outputs_mapped, monkeypatch):
    monkeypatch.setattr(route, "route", lambda *a: pytest.fail("asked for a route"))
    x = torch.randn(2, 40, 64)
    hooked = _layer()
    hooked.register_forward_pre_hook(lambda m, i: None)  # a calibration's: transient's output is fresh
    for layer in (_layer(slot=None), hooked):
        with torch.no_grad():
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    layer = _layer()
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))  # autograd: F.linear


def test_the_ffn_activates_the_buffer_in_place_on_the_scratch_route(small_outputs_mapped, monkeypatch):
    ffn, x = gelu_ffn(96)
    with torch.no_grad():
        want = ffn(x)
        optimize(ffn)
        ffn.up.packs, ffn.up.small_plain = True, False
        _choose(x, "scratch", ("gelu", "none"))
        hidden = ffn.up.activated(x, F.gelu)  # MKL into the buffer, then GELU in place
        assert hidden.data_ptr() == linear.scratch("ffn.up", hidden.shape, x).data_ptr()
        torch.testing.assert_close(hidden, F.gelu(F.linear(x, ffn.up.weight, ffn.up.bias)), rtol=1e-5,
                                   atol=1e-5)
        got = ffn(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_recorded_attention_keeps_each_layers_q_k_v(small_outputs_mapped, monkeypatch):
    """An analysis keeps every layer's q, k, v, which are views of the fused projection's output: on the
    buffer route the next layer would write over them."""
    import lmforge
    from lmforge.analysis.attention import inspecting

    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-tiny")).eval()
    ids = torch.randint(5, model.config.vocab_size, (2, 40))
    monkeypatch.setattr(route, "route", lambda *a: "scratch")
    records = []
    for fast in (False, True):
        optimize(model, enabled=fast)
        for m in model.modules():
            if type(m) is FastLinear:
                m.small_plain = False
        with torch.no_grad(), inspecting(model, record="all") as inspection:
            model(ids)
        records.append(inspection.records)
    assert len(records[0]) > 1 and records[0].keys() == records[1].keys()
    for key, plain in records[0].items():
        for name in ("q", "k", "v"):
            got, want = getattr(records[1][key], name), getattr(plain, name)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_an_entry_naming_no_route_is_measured_again_and_replaced(small_outputs_mapped, monkeypatch, tmp_path):
    store = tmp_path / "kernels.json"
    monkeypatch.setenv("LMFORGE_INT8_KERNELS", str(store))
    layer, x = _layer(), torch.randn(2, 40, 64)
    from lmforge.quant.isa import machine

    name = "|".join(map(str, (*route.key_of(x, 96, ("none", True)), "+".join(route.ROUTES))))
    store.write_text(json.dumps({machine(): {name: "mkl"}}))
    with torch.no_grad():
        layer(x)
    assert kernel_store.recall((*route.key_of(x, 96, ("none", True)), "+".join(route.ROUTES))) in route.ROUTES
    assert set(route.CHOICES.values()) <= set(route.ROUTES)


def test_a_route_is_measured_once_and_written_down(small_outputs_mapped, monkeypatch, tmp_path):
    store = tmp_path / "kernels.json"
    monkeypatch.setenv("LMFORGE_INT8_KERNELS", str(store))
    layer, x = _layer(), torch.randn(2, 40, 64)
    with torch.no_grad():
        layer(x)
        key = route.key_of(x, 96, ("none", True))
        times = route.TIMINGS[key]
        assert set(times) == {"onednn", "scratch"} and all(t > 0 for t in times.values())
        written = next(iter(json.loads(store.read_text()).values()))
        assert list(written.values()) == [route.CHOICES[key]]
        route.CHOICES.clear()  # a later process: reads the file, times nothing
        monkeypatch.setattr(kernel_store, "alternating", lambda *a, **k: pytest.fail("measured again"))
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert [c["route"] for c in route.choices()] == list(written.values())
