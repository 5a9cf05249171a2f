"""fast.accelerate: the same results as the plain modules, applied only inside the block, fully undone."""
import threading

import pytest
import torch
from torch import nn

import lmforge
from lmforge.fast.accelerate import SWAPS, FastBlock, FastFeedForward, accelerate, accelerated
from lmforge.fast.dropout import FastDropout
from lmforge.fast.linear import FastLinear
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


def test_swaps_inside_the_block_and_restores_after_even_on_an_error():
    model = lmforge.build(lmforge.tiny("bert-base")).eval()
    before = _snapshot(model)
    with accelerate(model):
        assert accelerated(model)
        kinds = {type(m) for m in model.modules()}
        assert {FastLinear, FastDropout, FastBlock, FastFeedForward} <= kinds
        assert not kinds & set(SWAPS)  # every plain module of a swapped kind runs accelerated
        assert list(model.state_dict()) == list(before[1])  # the same state-dict names
        with accelerate(model):  # re-entrant: the inner block changes nothing
            assert accelerated(model)
        assert accelerated(model)
    assert not accelerated(model) and _same(_snapshot(model), before)
    with pytest.raises(RuntimeError, match="boom"):
        with accelerate(model):
            raise RuntimeError("boom")
    assert _same(_snapshot(model), before)


def test_two_threads_keep_it_accelerated_until_the_last_leaves():
    """A server's two workers: the first to leave must not restore the plain classes under the other."""
    model = lmforge.build(lmforge.tiny("bert-base")).eval()
    before = _snapshot(model)
    entered, first_left, second_may_leave = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def first():
        with accelerate(model):
            entered.set()
            second_may_leave.wait(10)
        first_left.set()

    def second():
        entered.wait(10)
        with accelerate(model):
            second_may_leave.set()
            first_left.wait(10)
            seen.append((accelerated(model), {type(m) for m in model.modules()} & set(SWAPS)))

    threads = [threading.Thread(target=f) for f in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == [(True, set())]  # after the first thread left: still accelerated, no plain module back
    assert not accelerated(model) and _same(_snapshot(model), before)


def test_a_users_own_subclass_keeps_its_forward():
    class Mine(nn.Linear):
        pass

    layer = nn.Sequential(Mine(4, 4), nn.Linear(4, 4))
    with accelerate(layer):
        assert type(layer[0]) is Mine and type(layer[1]) is FastLinear
    assert type(layer[1]) is nn.Linear


@pytest.mark.parametrize("name", ["bert-base", "gpt2", "t5-small", "bart-base", "llama-3.2-1b", "albert-base"])
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
        with accelerate(model):
            fast = model(ids, mask, **kwargs)
    assert torch.equal(fast.last_hidden_state, plain.last_hidden_state) and torch.equal(fast.logits, plain.logits)


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
        with accelerate(model, fast):
            (model(ids).last_hidden_state * direction).sum().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    assert all(torch.equal(a, b) for a, b in zip(grads(True), grads(False)))


def test_dropout_is_drawn_by_the_cheaper_mask_inside_only():
    layer = nn.Dropout(0.5).train()
    x = torch.ones(4096)
    with accelerate(layer):
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
        with accelerate(ffn):
            assert torch.equal(ffn(x), want)
        h = torch.randn(2, 5, cfg.d_model)
        want = x + h
        block.__class__ = FastBlock
        got = block._add(x, h)
        block.__class__ = Block
    assert torch.equal(got, want) and got.data_ptr() == h.data_ptr()  # the sublayer's output, overwritten
