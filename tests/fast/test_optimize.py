"""lmforge.optimize: the same results as the plain modules, applied once, fully undone by enabled=False."""

import pytest
import torch
from torch import nn

import lmforge
from lmforge.fast.dropout import FastDropout
from lmforge.fast.linear import FastLinear
from lmforge.fast.optimize import SWAPS, FastBlock, FastFeedForward, optimized, optimized_for
from lmforge.fast.paths import FastPaths
from lmforge.heads import attach
from lmforge.layers.block import Block
from lmforge.layers.feedforward import FeedForward


def _snapshot(model: nn.Module) -> tuple:
    """Every module's class, instance attributes and mode; every tensor's storage, strides and values."""
    modules = [(name, type(m), sorted(m.__dict__), m.training) for name, m in model.named_modules()]
    tensors = {k: (v.data_ptr(), v.stride(), v.clone()) for k, v in model.state_dict().items()}
    return modules, tensors


def _same(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[1].keys() == b[1].keys() and all(
        a[1][k][:2] == b[1][k][:2] and torch.equal(a[1][k][2], b[1][k][2]) for k in a[1])


def test_optimize_swaps_once_and_is_undone_by_enabled_false():
    model = lmforge.build(lmforge.tiny("bert-base")).eval()
    before = _snapshot(model)
    assert lmforge.optimize(model) is model and optimized(model)
    kinds = {type(m) for m in model.modules()}
    assert {FastLinear, FastDropout, FastBlock, FastFeedForward} <= kinds
    assert not kinds & set(SWAPS)  # every plain module of a swapped kind runs accelerated
    assert list(model.state_dict()) == list(before[1])  # the same state-dict names
    lmforge.optimize(model)  # twice: the same
    assert {type(m) for m in model.modules()} == kinds
    lmforge.optimize(model, enabled=False)
    assert not optimized(model) and _same(_snapshot(model), before)


@pytest.mark.parametrize("model, options, field", [
    ("x", {}, "model"), (None, {"enabled": "no"}, "enabled"), (None, {"enabled": 0}, "enabled"),
    (None, {"paths": {}}, "paths")])
def test_optimize_refuses_what_it_cannot_apply_and_changes_nothing(model, options, field):
    plain = lmforge.build(lmforge.tiny("bert-base")).eval()
    before = _snapshot(plain)
    with pytest.raises(lmforge.OptionsError) as refused:  # "no" is truthy: it switched everything on
        lmforge.optimize(plain if model is None else model, **options)
    assert getattr(refused.value, "field", None) == field and _same(_snapshot(plain), before)


def test_no_call_is_wrapped_and_no_lock_is_taken():
    """Speed is applied once: a forward is nn.Module's own call, whatever the model's state."""
    model = lmforge.optimize(lmforge.build(lmforge.tiny("bert-base")).eval())
    assert type(model).__call__ is nn.Module.__call__
    classes = [type(m) for m in model.modules()]
    with torch.inference_mode():
        model(torch.randint(3, 99, (2, 7)))
    assert [type(m) for m in model.modules()] == classes  # nothing swapped by the call


def test_model_and_layers_import_nothing_from_the_speed_package():
    import pathlib
    import re

    root = pathlib.Path(lmforge.__file__).parent
    files = [root / "model.py", *sorted((root / "layers").rglob("*.py"))]
    offenders = [f.name for f in files
                 if re.search(r"^\s*(from|import) lmforge\.(fast|quant)", f.read_text(), re.M)]
    assert offenders == []


def test_a_users_own_subclass_keeps_its_forward():
    class Mine(nn.Linear):
        pass

    layer = nn.Sequential(Mine(4, 4), nn.Linear(4, 4))
    with optimized_for(layer):
        assert type(layer[0]) is Mine and type(layer[1]) is FastLinear
    assert type(layer[1]) is nn.Linear


@pytest.mark.parametrize("name", [
    "bert-base",
    "gpt2",
    "t5-small",
    "bart-base",
    "llama-3.2-1b",
    "albert-base",
])
def test_inference_outputs_are_bitwise_the_plain_ones(name):
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny(name)).eval()
    attach(model, "lm")
    ids = torch.randint(3, 99, (3, 11), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    kwargs = {"decoder_input_ids": ids[:, :5]} if model.config.architecture == "encoder-decoder" else {}
    with torch.inference_mode():
        plain = model(ids, mask, **kwargs)
        # packed rows sum in another order, and the native attention (where dh suits it) and oneDNN's
        # linear in their own
        lmforge.optimize(model, paths=FastPaths(unpad="never", native_attention=False, onednn_linear=False))
        fast = model(ids, mask, **kwargs)
    assert torch.equal(fast.last_hidden_state, plain.last_hidden_state) and \
        torch.equal(fast.logits, plain.logits)


@pytest.mark.parametrize("ffn", ["gelu", "swiglu"])
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_training_gradients_are_the_plain_ones_without_dropout(ffn, placement):
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base").replace(ffn=ffn, norm_placement=placement, dropout=0.0,
                                                           attention_dropout=0.0))
    ids = torch.randint(3, 99, (2, 9), generator=torch.Generator().manual_seed(0))
    direction = torch.randn(2, 9, model.config.d_model, generator=torch.Generator().manual_seed(1))

    def grads(fast: bool) -> list:
        model.zero_grad()
        lmforge.optimize(model, enabled=fast)
        (model(ids).last_hidden_state * direction).sum().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    assert all(torch.equal(a, b) for a, b in zip(grads(True), grads(False)))


def test_dropout_is_drawn_by_the_cheaper_mask_inside_only():
    layer = nn.Dropout(0.5).train()
    x = torch.ones(4096)
    with optimized_for(layer):
        assert type(layer) is FastDropout
        torch.manual_seed(0)
        kept = layer(x) != 0
    assert 0.45 < kept.float().mean() < 0.55 and type(layer) is nn.Dropout


def test_inference_block_and_feed_forward_write_in_place_with_the_same_results():
    cfg = lmforge.tiny("gpt2").replace(ffn="gelu")
    block, ffn = Block(cfg).eval(), FeedForward(cfg).eval()
    x = torch.randn(2, 5, cfg.d_model)
    with torch.inference_mode():
        want = ffn(x)
        lmforge.optimize(ffn, paths=FastPaths(onednn_linear=False))  # oneDNN sums in its own order
        assert torch.equal(ffn(x), want)
        h = torch.randn(2, 5, cfg.d_model)
        want = x + h
        block.__class__ = FastBlock
        got = block._add(x, h)
        block.__class__ = Block
    assert torch.equal(got, want) and got.data_ptr() == h.data_ptr()  # the sublayer's output, overwritten


def test_generate_runs_the_model_as_given_with_the_same_tokens():
    """No acceleration is switched on behind the caller's back: a plain model decodes with its plain
    modules, an optimized one with its fast ones, and the tokens are the same."""
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("gpt2")).eval()
    attach(model, "lm")
    seen = []
    model.decoder.blocks[0].ffn.up.register_forward_pre_hook(lambda module, args: seen.append(type(module)))
    prompt = torch.tensor([[5, 6, 7]])
    plain = lmforge.generate(model, prompt, max_new_tokens=4)
    assert set(seen) == {nn.Linear}
    seen.clear()
    fast = lmforge.generate(lmforge.optimize(model), prompt, max_new_tokens=4)
    assert set(seen) == {FastLinear} and torch.equal(plain, fast)
    with pytest.raises(lmforge.OptionsError, match="accelerated"):  # the old per-call flag is gone
        lmforge.generate(model, prompt, max_new_tokens=4, accelerated=False)


@pytest.mark.parametrize("name, layer", [("gpt2", "attn.out"), ("gpt2", "ffn.up"), ("gpt2", "ffn.down"),
                                         ("gpt2", "ffn"), ("gpt2", "attn"), ("llama-3.2-1b", "ffn.gate")])
def test_an_output_a_forward_hook_keeps_is_not_overwritten_in_place(name, layer):
    """The in-place activation and residual sum write into a sublayer's fresh output: not where a hook
    (an analysis) has kept it."""
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny(name)).eval()
    kept = []

    def keep(module, args, out):
        out = out[0] if isinstance(out, tuple) else out
        kept.append((out, out.clone()))

    model.decoder.blocks[0].get_submodule(layer).register_forward_hook(keep)
    lmforge.optimize(model, paths=FastPaths(unpad="never"))
    with torch.inference_mode():
        model(torch.randint(3, 99, (2, 7), generator=torch.Generator().manual_seed(0)))
    assert len(kept) == 1 and torch.equal(kept[0][0], kept[0][1])


def test_turning_off_leaves_a_users_own_attributes_of_the_same_names():
    class Mine(nn.Module):
        def __init__(self):
            super().__init__()
            self.slot, self.onednn, self.small_plain = "kept", 1, 2
            self.layer = nn.Linear(4, 4)

    model = Mine()
    lmforge.optimize(model)
    lmforge.optimize(model, enabled=False)
    assert (model.slot, model.onednn, model.small_plain) == ("kept", 1, 2) and type(model.layer) is nn.Linear
    assert not {"slot", "onednn", "small_plain"} & set(model.layer.__dict__)


@pytest.mark.parametrize("grad", [False, True])
def test_under_autocast_the_residual_stream_keeps_its_dtype(grad):
    """A bf16 sublayer output plus the fp32 residual is fp32; summed into the bf16 output it was
    rounded to bf16 (a frozen layer in training, as inference)."""
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base").replace(dropout=0.0, attention_dropout=0.0))
    model.requires_grad_(False).train(grad)
    ids = torch.randint(3, 99, (2, 9), generator=torch.Generator().manual_seed(0))

    def run(fast: bool) -> torch.Tensor:
        lmforge.optimize(model, enabled=False)
        if fast:
            lmforge.optimize(model, paths=FastPaths(unpad="never"))
        with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16):
            return model(ids).last_hidden_state

    plain, fast = run(False), run(True)
    assert fast.dtype == plain.dtype and torch.equal(fast, plain)
