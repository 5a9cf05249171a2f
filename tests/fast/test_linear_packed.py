"""FastLinear's packed weight (FastPaths.packed_weights) and an FFN's activation inside oneDNN's call: the
same results as the unpacked product and the separate activation, within float rounding, and never a
stale copy of a weight that changed."""
import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmforge import optimize
from lmforge.fast import linear
from lmforge.fast.linear import FastLinear
from lmforge.fast.paths import FastPaths
from lmforge.layers.feedforward import gelu_tanh
from tests.fast.ffn_cases import gelu_ffn

pytestmark = pytest.mark.skipif(not linear.ONEDNN, reason="this torch has no oneDNN linear")


def _layer(d_in=64, d_out=96, bias=True) -> FastLinear:
    torch.manual_seed(0)
    layer = FastLinear(d_in, d_out, bias=bias)
    layer.onednn, layer.small_plain, layer.packs = True, False, True
    return layer


def _unpacked(layer: FastLinear, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, layer.weight, layer.bias, "none", [], "")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 64), (14, 64), (3, 40, 64), (0, 64)])
def test_packed_route_equals_the_unpacked_one(shape, bias):
    layer = _layer(bias=bias)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = layer(x)
        torch.testing.assert_close(got, _unpacked(layer, x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert layer.__dict__["_packed"][2].is_mkldnn  # it ran on the packed copy


def _fused_step(layer: FastLinear, x: torch.Tensor, switch: bool) -> None:
    """A training step (in train mode where `switch`, else left in eval mode, as one who trains without
    dropout does) whose fused AdamW leaves W's version counter as it was."""
    version = layer.weight._version
    if switch:
        layer.train()
        assert "_packed" not in layer.__dict__
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.5, fused=True)
    layer(x).square().sum().backward()
    optimizer.step()
    assert layer.weight._version == version  # what the version key alone would miss
    if switch:
        layer.eval()


@pytest.mark.parametrize("switch", [True, False])
def test_training_drops_the_copy_that_a_fused_step_would_leave_stale(switch):
    """A forward with gradients (a step may follow) and a train() / eval() switch each drop the copy, so
    a fused AdamW step, which bumps no version counter, is never followed by a stale product."""
    layer, x = _layer(), torch.randn(20, 64)
    layer.eval()
    with torch.no_grad():
        layer(x)
    assert "_packed" in layer.__dict__
    _fused_step(layer, x, switch)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change", ["optimizer step", "in place", "load_state_dict", "new tensor"])
def test_a_weight_that_changed_is_packed_again(change):
    layer, x = _layer(), torch.randn(20, 64)
    with torch.no_grad():
        layer(x)
    packed = layer.__dict__["_packed"]
    if change == "optimizer step":
        layer(x).square().sum().backward()
        torch.optim.SGD(layer.parameters(), lr=0.5).step()
    elif change == "in place":  # no forward with gradients: the version counter alone tells
        with torch.no_grad():
            layer.weight.mul_(2)
    elif change == "load_state_dict":
        layer.load_state_dict({"weight": torch.randn(96, 64), "bias": torch.randn(96)})
    else:
        layer.weight = nn.Parameter(torch.randn(96, 64))
    with torch.no_grad():
        got = layer(x)
        torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert layer.__dict__["_packed"] is not packed


def test_an_inference_tensor_weight_is_read_as_it_is():
    """A weight made under inference_mode has no version counter, so a change to it would leave the
    packed copy stale: it is never packed."""
    with torch.inference_mode():
        layer = _layer()
        x = torch.randn(20, 64)
        assert torch.equal(layer(x), _unpacked(layer, x))
    assert "_packed" not in layer.__dict__


def test_flag_off_and_optimize_off_keep_no_copy():
    """Off by default (a plain optimize); FastPaths.frozen() packs; optimize(enabled=False) drops it."""
    assert not FastPaths().packed_weights and FastPaths.frozen(unpad="never").packed_weights
    assert FastPaths.frozen(unpad="never").unpad == "never"
    model = nn.Sequential(nn.Linear(64, 600), nn.ReLU(), nn.Linear(600, 64))
    x = torch.randn(32, 64)
    with torch.no_grad():
        want = model(x)
        optimize(model)
        unpacked = model(x)
        assert not any("_packed" in m.__dict__ for m in model)
        optimize(model, paths=FastPaths.frozen())
        packed = model(x)
        assert sum("_packed" in m.__dict__ for m in model) == 2
        optimize(model, enabled=False)
        assert not any("_packed" in m.__dict__ or "packs" in m.__dict__ for m in model)
        assert torch.equal(model(x), want)
    torch.testing.assert_close(unpacked, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("clone", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))])
def test_a_packed_model_copies_and_pickles_without_its_copy(clone):
    model = optimize(nn.Sequential(nn.Linear(64, 600), nn.Linear(600, 64)), paths=FastPaths.frozen())
    x = torch.randn(32, 64)
    with torch.no_grad():
        want = model(x)
        twin = clone(model)
        assert not any("_packed" in m.__dict__ for m in twin) and "_packed" in model[0].__dict__
        assert torch.equal(twin(x), want)


@pytest.mark.parametrize("act", [F.gelu, gelu_tanh, F.relu])
def test_an_activation_inside_the_product_equals_it_after(act):
    layer, x = _layer(d_out=600), torch.randn(2, 33, 64)
    with torch.no_grad():
        fused = layer.activated(x, act)
        torch.testing.assert_close(fused, act(F.linear(x, layer.weight, layer.bias)), rtol=1e-5, atol=1e-5)


def test_no_activation_inside_where_oneDNN_lacks_it_a_hook_watches_or_grad_is_on():
    layer, x = _layer(), torch.randn(20, 64)
    assert layer.activated(x, F.gelu) is None  # autograd: F.linear's graph
    seen = []
    with torch.no_grad():
        assert layer.activated(x, F.silu) is None
        layer.register_forward_hook(lambda m, i, out: seen.append(out))
        assert layer.activated(x, F.gelu) is None  # the hook must see the product before the activation


def test_the_ffn_runs_its_activation_inside_the_product(monkeypatch):
    ffn, x = gelu_ffn(600)
    with torch.no_grad():
        want = ffn(x)
        optimize(ffn)
        posts = []
        real = torch.ops.mkldnn._linear_pointwise
        monkeypatch.setattr(linear.torch.ops.mkldnn, "_linear_pointwise",
                            lambda *a: posts.append(a[3]) or real(*a))
        got = ffn(x)
    assert posts == ["gelu", "none"]  # up with GELU inside, then down
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_new_parameter_at_the_same_address_and_version_is_packed_again():
    """A Parameter made over the same storage after a write through `.data` (no version bump) has the old
    one's address and version: the key holds the Parameter itself too."""
    layer, x = _layer(), torch.randn(20, 64)
    storage = torch.randn(96, 64)
    layer.weight = nn.Parameter(storage)
    with torch.no_grad():
        layer(x)
    storage.data.copy_(torch.randn(96, 64))
    layer.weight = nn.Parameter(storage)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_eval_on_an_eval_module_keeps_the_copy_and_a_computed_weight_is_never_packed():
    """generate() calls eval() at every call: only a change of mode drops the copy. A parametrized weight
    (a pruning mask edited in place) is computed at each read: read as it is."""
    from torch.nn.utils import parametrize

    layer, x = _layer(), torch.randn(20, 64)
    layer.eval()
    with torch.no_grad():
        layer(x)
    packed = layer.__dict__["_packed"]
    layer.eval()
    assert layer.__dict__["_packed"] is packed
    mask = torch.ones(96, 64)

    class Masked(nn.Module):
        def forward(self, w):
            return w * mask

    parametrize.register_parametrization(layer, "weight", Masked())
    with torch.no_grad():
        layer(x)
        mask[:48] = 0
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert "_packed" not in layer.__dict__ or layer.__dict__["_packed"] is packed
