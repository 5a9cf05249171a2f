"""Head importance and iterative head pruning (Michel, Levy & Neubig 2019, "Are Sixteen Heads
Really Better than One?").

Every attention's heads carry a gate xi_h (layers/inspection.py). The importance of a head is
I_h = E_x |dL/dxi_h| at the current gates (eq. 3), over a data set, normalised per layer by the
layer's L2 norm (sec. 4.2: scores of different layers are otherwise not comparable). The mean is
over batches of the batch's mean loss (the paper's code), not over single examples: |.| of a batch's
gradient, so the scores, and their order, depend on batch_size. Pruning is iterative (sec. 4.3):
mask the least important heads, `step` of all heads at a level (the paper's code), re-estimate, repeat,
with the task metric measured at every level; a random order is the control. Every layer keeps
at least one head. `compress/head_pruning.py` then removes the masked heads physically.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from lmforge.compress.head_pruning import attention_keys, kept_heads
from lmforge.config.options import check_options, option
from lmforge.layers.inspection import inspecting
from lmforge.utils.modes import evaluating

ORDERS = ("importance", "random")
MAX_BATCH = 65536  # examples per importance batch (TrainConfig's bound on batch_size)


@dataclass
class CurveOptions:
    """How an iterative head-pruning curve runs (Michel et al. 2019, sec. 4.3)."""

    order: str = option("importance", "importance (re-estimated at every level) or a seeded random order",
                        choices=ORDERS)
    step: float = option(0.1, "share of all heads masked per level", low=0, high=1, open_low=True,
                         open_high=True)
    until: float | None = option(None, "stop once the metric falls below until x the unpruned one",
                                 low=0, high=1, open_low=True, unset="never")
    max_fraction: float = option(0.9, "stop before more than this share of the heads is masked", low=0,
                                 high=1)
    # random_curves draws order i from seed + i: any 64-bit value, past a run's seed bound
    seed: int = option(0, "seed of the random order", low=0, high=2 ** 64 - 1)
    batch_size: int = option(32, "examples per batch of the importance estimate", low=1, high=MAX_BATCH)

    def __post_init__(self) -> None:
        check_options(self)  # types, finiteness (NaN passes every comparison), bounds and choices


def full_gates(cfg, requires_grad: bool = False) -> dict:
    """attention -> per layer (H_l,) gates of ones (each layer's heads after physical pruning)."""
    gates: dict = {}
    for key in attention_keys(cfg):
        attention, _, _ = key.partition(".")
        ones = torch.ones(len(kept_heads(cfg, key)), requires_grad=requires_grad)
        gates.setdefault(attention, []).append(ones)
    return gates


def _batches(task, examples: list, batch_size: int):
    for start in range(0, len(examples), batch_size):
        yield {k: v.to(task.device) for k, v in task.collate(examples[start:start + batch_size]).items()}


def head_importance(task, examples: list, gates: dict | None = None, batch_size: int = 32,
                    normalise: bool = True) -> dict:
    """attention -> per layer (H_l,) importance I_h = mean over batches of |dL/dxi_h| at `gates`
    (ones unless given: masked heads then have xi = 0), L2-normalised per layer."""
    model = task.model
    gates = {a: [g.detach().clone().requires_grad_(True) for g in layer_gates]
             for a, layer_gates in (gates or full_gates(model.config)).items()}
    total = {a: [torch.zeros_like(g) for g in layer_gates] for a, layer_gates in gates.items()}
    try:  # in eval mode, no dropout: the gradient of the model that is scored
        with evaluating(task), inspecting(model, gates=gates):
            for batch in _batches(task, examples, batch_size):
                task.forward(batch).loss.backward()
                for a, layer_gates in gates.items():
                    for acc, g in zip(total[a], layer_gates):
                        acc += g.grad.abs()  # |dL/dxi| per batch: a batch's mean loss, as the paper's code
                        g.grad = None
    finally:
        model.zero_grad(set_to_none=True)
    n = max(1, -(-len(examples) // batch_size))
    out = {a: [acc / n for acc in accs] for a, accs in total.items()}
    return {a: [_per_layer(s) for s in scores] for a, scores in out.items()} if normalise else out


def _per_layer(scores: torch.Tensor) -> torch.Tensor:
    return scores / (scores.norm(p=2) + 1e-20)


def metric(task, records: list, examples: list, gates: dict | None, batch_size: int = 64) -> tuple:
    """(name, value) of the task's primary metric with heads gated by `gates` (None: all heads)."""
    with inspecting(task.model, gates=gates or {}):
        predictions = task.decode(records, examples, task.outputs(examples, batch_size))
    name, value = next(iter(task.score(records, predictions).items()))
    return name, float(value)


def _candidates(gates: dict) -> list:
    """(attention, layer, head) of heads still on, in layers that would keep another head."""
    out = []
    for a, layer_gates in gates.items():
        for layer, g in enumerate(layer_gates):
            on = [h for h in range(g.numel()) if g[h] > 0]
            if len(on) > 1:
                out += [(a, layer, h) for h in on]
    return out


def _mask_next(gates: dict, ranked: list, n: int) -> list:
    """Turn off the first n heads of `ranked` (least important first), never a layer's last one."""
    done = []
    for a, layer, h in ranked:
        if len(done) == n:
            break
        g = gates[a][layer]
        if g[h] > 0 and int((g > 0).sum()) > 1:
            g[h] = 0.0
            done.append((a, layer, h))
    return done


def total_heads(gates: dict) -> int:
    """Heads in every attention of the model."""
    return sum(g.numel() for layer_gates in gates.values() for g in layer_gates)


def pruning_curve(task, score_data: tuple, importance_examples: list, options: CurveOptions | None = None,
                  progress=None) -> tuple:
    """Iterative pruning: (levels, final gates). Each level masks `options.step` of all heads more, by
    importance (re-estimated on `importance_examples` at each level) or in a seeded random order,
    and records {"pruned", "fraction", "metric", "masked": [[attention, layer, head], ...] newly
    masked} on score_data = (records, examples). Stops past max_fraction, when no head can go, or
    when metric < until x the unpruned metric."""
    o = options or CurveOptions()
    gates = full_gates(task.model.config)
    # heads masked a level as Michel et al.'s code counts them: max(1, int(heads x masking_amount))
    n_total, per_level = total_heads(gates), max(1, int(o.step * total_heads(gates)))
    name, base = metric(task, *score_data, gates)
    levels, pruned = [{"pruned": 0, "fraction": 0.0, "metric": base, "name": name, "masked": []}], 0
    shuffled = _candidates(gates)
    random.Random(o.seed).shuffle(shuffled)
    while pruned + per_level <= o.max_fraction * n_total:
        ranked = (shuffled if o.order == "random"
                  else _by_importance(task, importance_examples, gates, o.batch_size))
        done = _mask_next(gates, ranked, per_level)
        if not done:
            break
        pruned += len(done)
        levels.append({"pruned": pruned, "fraction": pruned / n_total,
                       "metric": metric(task, *score_data, gates)[1],
                       "name": name, "masked": [list(d) for d in done]})
        if progress is not None:
            progress(levels[-1])
        if o.until is not None and levels[-1]["metric"] < o.until * base:
            break
    return levels, gates


def random_curves(task, score_data: tuple, orders: int, options: CurveOptions | None = None,
                  progress=None) -> list:
    """The control of Michel et al.'s fig. 3 as the field runs it: `orders` pruning curves in random
    order (options' step and max_fraction), seeds seed, seed + 1, ... fixed before any is scored (never
    picked by their outcome)."""
    if orders < 1:
        raise ValueError(f"random orders={orders!r}: at least one")
    o = options or CurveOptions()
    # until stays off: every order runs its levels in full, so the band's levels line up
    return [pruning_curve(task, score_data, [], replace(o, order="random", until=None, seed=o.seed + i),
                          progress=progress)[0] for i in range(orders)]


def curve_band(curves: list) -> list:
    """Per level of equally stepped curves: {"pruned", "fraction", "mean", "sd" (sample; 0 for one
    curve), "n", "metrics"}; levels some curve lacks are left out."""
    band = []
    for levels in zip(*curves):
        values = [lv["metric"] for lv in levels]
        mean = sum(values) / len(values)
        sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
        band.append({"pruned": levels[0]["pruned"], "fraction": levels[0]["fraction"], "mean": mean, "sd": sd,
                     "n": len(values), "metrics": values})
    return band


def against_band(curve: list, band: list) -> dict:
    """The importance curve against the random orders' mean at each pruned level (level 0, the
    unpruned model, is the same for both): margins and whether it is ahead at every level."""
    margins = [lv["metric"] - b["mean"] for lv, b in zip(curve[1:], band[1:])]
    return {"fraction": [b["fraction"] for b in band[1:]], "margin": margins,
            "in_sd": [m / b["sd"] if b["sd"] > 0 else None for m, b in zip(margins, band[1:])],
            "ahead_at_every_level": bool(margins) and all(m > 0 for m in margins)}


def _by_importance(task, examples: list, gates: dict, batch_size: int) -> list:
    """Heads still on, least important first, at the current gates."""
    scores = head_importance(task, examples, gates, batch_size)
    on = _candidates(gates)
    return sorted(on, key=lambda c: float(scores[c[0]][c[1]][c[2]]))


def gates_at(cfg, levels: list) -> dict:
    """The gates after every level of a pruning curve (each level's "masked" heads off)."""
    gates = full_gates(cfg)
    for level in levels:
        for a, layer, h in level["masked"]:
            gates[a][layer][h] = 0.0
    return gates


def masked_heads(gates: dict, cfg) -> dict:
    """The heads gates turn off, as prune_heads takes them: {"encoder.L": [original indices]}
    (a head's index in the unpruned model, through cfg.pruned_heads)."""
    out = {}
    for a, layer_gates in gates.items():
        for layer, g in enumerate(layer_gates):
            kept = kept_heads(cfg, f"{a}.{layer}")
            off = [kept[h] for h in range(g.numel()) if g[h] == 0]
            if off:
                out[f"{a}.{layer}"] = off
    return out
