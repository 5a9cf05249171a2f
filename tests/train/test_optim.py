"""AdamW groups, the fused kernel and the learning-rate schedules (train/optim.py)."""
import math

import torch
from torch import nn

from lmforge.train.optim import build_optimizer, can_fuse, lr_factor, param_groups


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
    assert lr_factor(0, 10, 110, "linear") == 0.1 and lr_factor(9, 10, 110, "linear") == 1.0
    assert lr_factor(60, 10, 110, "linear") == 0.5 and lr_factor(110, 10, 110, "linear") == 0.0
    assert math.isclose(lr_factor(60, 10, 110, "cosine"), 0.5)
    assert lr_factor(500, 10, 110, "constant") == 1.0
    assert lr_factor(110, 10, 110, "linear", min_ratio=0.1) == 0.1
