"""What an analysis asks of a forward pass: head gates, and attention recorded exactly.

- **Head gates** (Michel et al. 2019, sec. 2): Att(x) = sum_h xi_h Att_h(x) W_h^O; xi_h = 0
  masks head h, and |dL/dxi_h| at xi = 1 is its importance. A gate multiplies a head's output
  before the output projection, in whatever layout the kernel used.
- **Recording**: for the chosen layers, the probabilities softmax(scale q k^T + bias) are
  recomputed eagerly from the very q, k and mask bias the layer's kernel attended with (SDPA or
  another backend never hands its probabilities out), together with q, k and v for neuron views.

The model holds an `Inspection` (model.inspection, None by default: then nothing here runs) and
puts each stack's view of it on the AttentionContext.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import torch

KINDS = ("self", "cross")


def eager_probabilities(q: torch.Tensor, k: torch.Tensor, bias, scale: float) -> torch.Tensor:
    """softmax(scale q k^T + bias) in fp32: q (B, H, Tq, dh), k (B, Hkv, Tk, dh) -> (B, H, Tq, Tk)."""
    if k.shape[1] != q.shape[1]:  # GQA/MQA: each kv head serves a group of query heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.float()
    return torch.softmax(scores, dim=-1)


def gate_heads(merged: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """merged (..., H dh), heads side by side as every kernel merges them; gate (H,) -> xi_h per head."""
    H = gate.shape[0]
    if merged.shape[-1] % H:
        raise ValueError(f"a head gate of {H} heads does not divide the attention width {merged.shape[-1]}")
    heads = merged.unflatten(-1, (H, merged.shape[-1] // H))  # (..., H, dh)
    return (heads * gate.to(merged.dtype)[:, None]).flatten(-2)


@dataclass
class Record:
    """One layer's attention as its kernel computed it: probabilities and the q, k, v it used."""

    probs: torch.Tensor  # (B, H, Tq, Tk) fp32
    q: torch.Tensor  # (B, H, Tq, dh) after the position step (rotated, XL-shifted)
    k: torch.Tensor  # (B, Hkv, Tk, dh) after the cache and the pattern's transform (Linformer)
    v: torch.Tensor  # (B, Hkv, Tk, dh)
    scale: float


@dataclass
class Inspection:
    """Head gates by attention ("encoder", "decoder" self-attention; "cross") and the layers whose
    attention is recorded ("all", a set of layer indices, or None); records by (stack, kind, layer)."""

    gates: dict = field(default_factory=dict)  # attention -> per layer (H_l,) gates, or (L, H)
    record: object = None
    records: dict = field(default_factory=dict)

    def for_stack(self, stack: str, record=None) -> "StackInspection":
        """The view one stack's layers see; `record` adds layers to record on this pass."""
        layers = _union(self.record, record)
        return StackInspection(self, stack, layers)


def _union(a, b):
    if a == "all" or b == "all" or b is True:
        return "all"
    if a is None and not b:
        return None
    return frozenset(a or ()) | frozenset(b or ())


@dataclass
class StackInspection:
    """An Inspection as the layers of one stack ("encoder" or "decoder") see it."""

    owner: Inspection
    stack: str
    layers: object  # "all", a frozenset, or None

    def wants(self, layer: int) -> bool:
        """Whether `layer`'s attention is recorded on this pass."""
        return self.layers == "all" or (self.layers is not None and layer in self.layers)

    def gate(self, kind: str, layer: int) -> Optional[torch.Tensor]:
        """The (H,) gates of this stack's `kind` attention ("self" or "cross") at `layer`, or None."""
        gates = self.owner.gates.get(self.stack if kind == "self" else "cross")
        return None if gates is None else gates[layer]

    def keep(self, kind: str, layer: int, record: Record) -> None:
        """Store a layer's record under (stack, kind, layer)."""
        self.owner.records[(self.stack, kind, layer)] = record


@contextmanager
def inspecting(model, record=None, gates: Optional[dict] = None):
    """Run the model's forwards under an Inspection (recording `record`: "all" or layer indices;
    head `gates` by attention) and give it back; the model's own is restored on exit."""
    previous = model.inspection
    model.inspection = inspection = Inspection(gates=dict(gates or {}), record=record)
    try:
        yield inspection
    finally:
        model.inspection = previous
