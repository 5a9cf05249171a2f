"""ELMo's scalar mix (Peters et al. 2018, eq. 1): a task's weighted sum of a model's layers.

ELMo_task = gamma * sum_j softmax(s)_j h_j, with s (one scalar per layer) and gamma learned by
the task while the layers h_j stay frozen. Used for ELMo features, BERT layer mixes and the
scalar-mix probes of Tenney et al. (2019), whose "centre of gravity" reads the weights.
"""
from __future__ import annotations

import torch
from torch import nn


class ScalarMix(nn.Module):
    """gamma * sum_j softmax(s)_j h_j over n_layers layers; optional per-layer LayerNorm first
    (AllenNLP's do_layer_norm, which normalises each layer over its real tokens)."""

    def __init__(self, n_layers: int, layer_norm: bool = False) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"a scalar mix needs at least one layer, got {n_layers}")
        self.n_layers, self.layer_norm = n_layers, layer_norm
        self.scalars = nn.Parameter(torch.zeros(n_layers))  # s: uniform weights at the start
        self.gamma = nn.Parameter(torch.ones(()))

    @property
    def weights(self) -> torch.Tensor:
        """softmax(s): (n_layers,) the normalised layer weights."""
        return torch.softmax(self.scalars, dim=0)

    def forward(self, layers, mask: torch.Tensor | None = None) -> torch.Tensor:
        """layers: a sequence of n_layers tensors (..., d), or one (n_layers, ..., d) tensor;
        mask (...) True at real positions (used by the layer norm only) -> (..., d)."""
        stacked = layers if isinstance(layers, torch.Tensor) else torch.stack(list(layers))
        if stacked.shape[0] != self.n_layers:
            raise ValueError(f"scalar mix of {self.n_layers} layers given {stacked.shape[0]}")
        if self.layer_norm:
            stacked = _masked_layer_norm(stacked, mask)
        w = self.weights.to(stacked.dtype).view(-1, *([1] * (stacked.dim() - 1)))
        return self.gamma * (w * stacked).sum(0)


def _masked_layer_norm(stacked: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Each layer normalised by the mean and variance of all its real positions' values."""
    if mask is None:
        mask = torch.ones(stacked.shape[1:-1], dtype=torch.bool, device=stacked.device)
    m = mask[None, ..., None].to(stacked.dtype)  # (1, ..., 1)
    n = m.sum(dim=tuple(range(1, m.dim()))) * stacked.shape[-1]  # (1,) values per layer
    dims = tuple(range(1, stacked.dim()))
    mean = (stacked * m).sum(dims, keepdim=True) / n.view(-1, *([1] * (stacked.dim() - 1)))
    var = (((stacked - mean) * m) ** 2).sum(dims, keepdim=True) / n.view(-1, *([1] * (stacked.dim() - 1)))
    return (stacked - mean) / torch.sqrt(var + 1e-12)
