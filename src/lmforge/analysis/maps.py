"""What an attention view shows: per kind of attention, rows attending to columns, per layer and head.

Plain data shared by the extraction (analysis/attention.py) and the views (analysis/view.py):
a view never touches a model, and an extraction never draws.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class AttentionGroup:
    """One kind of attention: "self" (an encoder's or a decoder's), "encoder", "decoder" or "cross"."""

    name: str
    rows: list  # query tokens (strings)
    cols: list  # key tokens (strings)
    layers: list  # the model's layer index of each entry below
    probs: list  # per layer (H, Tq, Tk) float32; each row sums to 1 over the keys it may see
    queries: Optional[list] = None  # per layer (H, Tq, dh): q as the kernel saw it (rotated, XL-shifted)
    keys: Optional[list] = None  # per layer (H, Tk, dh): GQA's shared keys repeated to each query head
    scale: float = 1.0  # scores = scale * q . k + bias

    @property
    def n_heads(self) -> int:
        """Heads of the first layer (pruned models may differ per layer)."""
        return int(self.probs[0].shape[0]) if self.probs else 0


@dataclass
class AttentionMaps:
    """Every attention of one input: the groups, the token segments (sentence pairs) and a title."""

    groups: list  # AttentionGroup, in the order a view lists them
    title: str = ""
    segments: Optional[list] = None  # segment id of each row token of the first group
    meta: dict = field(default_factory=dict)  # model family, pattern, position scheme, ...

    def group(self, name: str) -> AttentionGroup:
        """The group called `name`."""
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"no attention group {name!r}; have {[g.name for g in self.groups]}")


def truncation_note(maps: AttentionMaps) -> str | None:
    """One line saying the text was cut to the model's max_seq_len (None when it was not)."""
    if not maps.meta.get("truncated"):
        return None
    return (f"The text was cut to the model's max_seq_len: {maps.meta['tokens_kept']} of its "
            f"{maps.meta['tokens_total']} tokens are shown.")

def random_maps(n_layers: int = 2, n_heads: int = 3, length: int = 7, dh: int = 4, seed: int = 0,
                cross: bool = False) -> AttentionMaps:
    """Well-formed maps of random numbers (for views' tests): softmax rows, q and k of each head."""
    g = torch.Generator().manual_seed(seed)
    tokens = ["[CLS]"] + [f"w{i}" for i in range(length - 2)] + ["[SEP]"]

    def group(name: str) -> AttentionGroup:
        q = [torch.randn(n_heads, length, dh, generator=g) for _ in range(n_layers)]
        k = [torch.randn(n_heads, length, dh, generator=g) for _ in range(n_layers)]
        probs = [torch.softmax(a @ b.transpose(-1, -2) / dh ** 0.5, -1) for a, b in zip(q, k)]
        return AttentionGroup(name, tokens, tokens, list(range(n_layers)), probs, q, k, dh ** -0.5)

    groups = [group("encoder"), group("decoder"), group("cross")] if cross else [group("self")]
    return AttentionMaps(groups, title="random", segments=[0] * length)
