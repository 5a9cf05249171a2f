"""AdamW groups, the fused kernel and the learning-rate schedules (train/optim.py)."""
import math

import pytest
import torch
from torch import nn

from lmforge.train.optim import build_optimizer, build_scheduler, can_fuse, lr_factor, param_groups


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 3))


def _train(net: nn.Module, optimizer, steps: int = 5) -> None:
    ids = torch.arange(20).view(4, 5)
    for _ in range(steps):
        loss = net(ids).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def test_biases_and_norms_are_not_decayed():
    groups = param_groups(_net(), weight_decay=0.1)
    decayed, plain = groups[0]["params"], groups[1]["params"]
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decayed) and len(decayed) == 3  # embedding + two matrices
    assert all(p.dim() == 1 for p in plain) and len(plain) == 4  # two biases, norm gain and bias


def test_cpu_parameters_take_the_fused_kernel_with_the_same_updates():
    fused_net, loop_net = _net(), _net()
    fused = build_optimizer(fused_net, 1e-2, 0.01, eps=1e-8)
    assert can_fuse(list(fused_net.parameters())) and fused.defaults["fused"]
    loop = torch.optim.AdamW(param_groups(loop_net, 0.01), lr=1e-2, eps=1e-8, foreach=False)
    _train(fused_net, fused)
    _train(loop_net, loop)
    for a, b in zip(fused_net.parameters(), loop_net.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_integer_or_meta_tensors_are_not_fused():
    assert not can_fuse([torch.zeros(2, dtype=torch.long)])
    assert not can_fuse([torch.zeros(2, device="meta")])


def test_schedules_warm_up_then_decay():
    assert lr_factor(0, 10, 110, "linear") == 0.0 and lr_factor(9, 10, 110, "linear") == 0.9
    assert lr_factor(10, 10, 110, "linear") == 1.0
    assert lr_factor(60, 10, 110, "linear") == 0.5 and lr_factor(110, 10, 110, "linear") == 0.0
    assert math.isclose(lr_factor(60, 10, 110, "cosine"), 0.5)
    assert lr_factor(500, 10, 110, "constant") == 1.0
    assert lr_factor(110, 10, 110, "linear", min_ratio=0.1) == 0.1


@pytest.mark.parametrize("schedule, reference", [("linear", "get_linear_schedule_with_warmup"),
                                                 ("cosine", "get_cosine_schedule_with_warmup"),
                                                 ("constant", "get_constant_schedule_with_warmup")])
@pytest.mark.parametrize("warmup", [0, 1, 3, 10])
def test_each_steps_lr_is_the_reference_schedules(schedule, reference, warmup):
    # the warm-up was one step ahead of the reference's (lr x (i + 1) / warmup: not 0 at the first step)
    transformers = pytest.importorskip("transformers")
    total = 10
    ours = build_scheduler(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=2.0), warmup, total, schedule)
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=2.0)
    args = (optimizer, warmup) if schedule == "constant" else (optimizer, warmup, total)
    theirs = getattr(transformers, reference)(*args)
    for _ in range(total):  # the steps a run of `total` takes
        assert ours.get_last_lr()[0] == pytest.approx(theirs.get_last_lr()[0], rel=1e-12, abs=1e-15)
        for scheduler in (ours, theirs):
            scheduler.optimizer.step()
            scheduler.step()


def test_cosine_with_a_floor_is_the_references():
    transformers = pytest.importorskip("transformers")
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    theirs = transformers.get_cosine_with_min_lr_schedule_with_warmup(optimizer, 3, 12, min_lr_rate=0.1)
    for step in range(12):
        want = theirs.get_last_lr()[0]
        assert lr_factor(step, 3, 12, "cosine", min_ratio=0.1) == pytest.approx(want, rel=1e-12)
        optimizer.step()
        theirs.step()


@pytest.mark.parametrize("preset", ["bert-base", "t5-small", "xlnet-base", "gpt2"])
def test_the_decayed_parameters_are_the_reference_trainers(preset):
    # XLNet's 2-D r_w_bias / r_r_bias / r_s_bias and T5's relative position bias table were decayed
    pytest.importorskip("transformers")
    import lmforge
    from transformers.trainer_pt_utils import get_parameter_names

    model = lmforge.build(lmforge.tiny(preset))
    norms = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
    reference = set(get_parameter_names(model, [nn.LayerNorm], norms))
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for g in param_groups(model, 0.1) if g["weight_decay"] for p in g["params"]}
    assert decayed == reference
