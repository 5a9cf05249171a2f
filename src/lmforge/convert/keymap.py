"""Declarative weight-name maps between a reference checkpoint and lmforge, and the engine
that applies them strictly.

A `Rule` names one lmforge tensor and the reference tensor(s) it comes from, with a
named fix-up: `copy`, `transpose` (GPT-2's Conv1D stores weights as (in, out)), and
concatenation along dim 0 when several reference tensors form one of ours (fused QKV).
`{i}` in a name stands for the layer index.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

# fix name -> function(tensor, *rule.args); export applies INVERSES[name] where the fix is not
# its own inverse
FIXES = {
    "copy": lambda t, *_: t,
    "transpose": lambda t, *_: t.t().contiguous(),
    "clone": lambda t, *_: t.clone(),  # a second reference name for one tensor (files refuse shared storage)
    # XLNet stores projections as (d_model, n_heads, d_head) einsum operands
    "heads_in": lambda t, *_: t.reshape(t.shape[0], -1).t().contiguous(),  # -> (n_heads*d_head, d_model)
    "heads_out": lambda t, *_: t.reshape(t.shape[0], -1).contiguous(),  # -> (d_model, n_heads*d_head)
    # BLOOM / GPT-NeoX fuse q, k, v per head: rows (n_heads, 3, d_head) -> lmforge's [q; k; v]
    "qkv_per_head": lambda t, n_heads: t.unflatten(0, (n_heads, 3, -1)).transpose(0, 1).reshape(t.shape),
    "row": lambda t, *_: t.reshape(-1),  # BART's final_logits_bias buffer (1, V) -> a (V,) bias
}
INVERSES = {
    "heads_in": lambda t, n_heads: t.t().reshape(t.shape[1], n_heads, -1).contiguous(),
    "heads_out": lambda t, n_heads: t.reshape(t.shape[0], n_heads, -1).contiguous(),
    "qkv_per_head": lambda t, n_heads: t.unflatten(0, (3, n_heads, -1)).transpose(0, 1).reshape(t.shape),
    "row": lambda t, *_: t[None],
}


@dataclass(frozen=True)
class Rule:
    """ours <- fix(theirs) (several `theirs` are concatenated along dim 0).

    `args` go to the fix and its inverse (e.g. the number of heads a reshape needs)."""

    ours: str
    theirs: tuple
    fix: str = "copy"
    args: tuple = ()


class ConversionError(ValueError):
    """A reference checkpoint whose tensors do not fit the lmforge model; names the tensors."""


def linear(ours: str, theirs: str, fix: str = "copy") -> list:
    """Rules for a Linear (or norm) module: its weight (with `fix`) and its bias."""
    return [Rule(f"{ours}.weight", (f"{theirs}.weight",), fix), Rule(f"{ours}.bias", (f"{theirs}.bias",))]


def expand(rules: list, n_layers: int) -> list:
    """Rules with `{i}` written out for every layer."""
    out = []
    for rule in rules:
        layers = range(n_layers) if "{i}" in rule.ours else [None]
        for i in layers:
            fmt = (lambda s: s.format(i=i)) if i is not None else (lambda s: s)
            out.append(Rule(fmt(rule.ours), tuple(fmt(t) for t in rule.theirs), rule.fix, rule.args))
    return out


def import_tensors(theirs: dict, rules: list, ignore: tuple = ()) -> dict:
    """Map reference tensors to lmforge names; every reference tensor must be used or ignored."""
    ours, used = {}, set()
    missing = sorted({t for r in rules for t in r.theirs if t not in theirs})
    if missing:
        raise ConversionError(f"checkpoint lacks {len(missing)} tensor(s): {missing[:8]}")
    for rule in rules:
        parts = [FIXES[rule.fix](theirs[t], *rule.args) for t in rule.theirs]
        ours[rule.ours] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        used.update(rule.theirs)
    unused = sorted(k for k in set(theirs) - used if not any(re.fullmatch(p, k) for p in ignore))
    if unused:
        raise ConversionError(f"checkpoint has {len(unused)} tensor(s) lmforge cannot place: {unused[:8]}")
    return ours


def export_tensors(ours: dict, rules: list, split_sizes: dict) -> dict:
    """The inverse: lmforge tensors to reference names (fused tensors split by `split_sizes[n]`)."""
    theirs = {}
    for rule in rules:
        tensor = ours[rule.ours]
        parts = [tensor] if len(rule.theirs) == 1 else tensor.split(split_sizes[len(rule.theirs)], dim=0)
        inverse = INVERSES.get(rule.fix, FIXES[rule.fix])  # copy and transpose are their own inverse
        for name, part in zip(rule.theirs, parts):
            theirs[name] = inverse(part, *rule.args).contiguous()
    return theirs
