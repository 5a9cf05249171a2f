"""Attention heatmaps for papers: one layer's heads of one group as a PNG or SVG figure.

Queries run down, keys across (the layout of Clark et al. 2019, "What Does BERT Look At?");
several heads form a grid with one shared colour bar. Token labels are drawn while they stay
legible, thinned when a panel has no room for all, and replaced by positions beyond ~80 tokens.
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

import torch

from lmforge.analysis.maps import AttentionMaps
from lmforge.utils.atomic import atomic_savefig

FORMATS = ("png", "svg")
_LABELLED = 80  # beyond this many tokens an axis shows positions, not token text


def write_figure(maps: AttentionMaps, path, group=None, layer=None, heads=None) -> Path:
    """Write the heatmaps of `layer` (a model layer; default the group's first recorded) of `group` (default:
    the first), heads `heads` (default all)."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ValueError("path: the figure's format comes from its suffix, .png or .svg, not "
                         f"{path.suffix!r}")
    g, probs, heads = selection(maps, group, layer, heads)
    fig = _draw(probs, heads, g, g.layers[0] if layer is None else layer, maps.title)
    atomic_savefig(fig, path, dpi=200 if fmt == "png" else None, fmt=fmt)
    return path


def selection(maps: AttentionMaps, group=None, layer=None, heads=None) -> tuple:
    """(the group, its `layer`'s (heads, T, T) probabilities, the heads to draw) of a figure; a choice the
    maps lack is a ValueError naming it (group=, layer=, heads=)."""
    g = _group(maps, group)
    # None: the first layer recorded (the maps may hold only later layers, as --layers 1-2 records them)
    layer = g.layers[0] if layer is None and g.layers else layer
    if isinstance(layer, bool) or not isinstance(layer, int) or layer not in g.layers:
        raise ValueError(f"layer={layer!r}: group {g.name!r} has layers {list(g.layers)}")
    probs = torch.as_tensor(g.probs[g.layers.index(layer)]).detach().to("cpu", torch.float32)
    return g, probs, _heads(heads, probs.shape[0])


def _group(maps: AttentionMaps, name):
    """The group called `name`, or the first."""
    if not maps.groups:
        raise ValueError("maps: no attention groups to draw")
    if name is None:
        return maps.groups[0]
    names = [g.name for g in maps.groups]
    if name not in names:
        raise ValueError(f"group={name!r}: have {names}")
    return maps.groups[names.index(name)]


def _heads(heads, n: int) -> list:
    """The head indices to draw, checked against the layer's `n` heads."""
    if heads is None:
        return list(range(n))
    heads = [heads] if isinstance(heads, int) else list(heads)
    bad = [h for h in heads if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < n]
    if not heads or bad:
        raise ValueError(f"heads={heads!r}: pick one or more of 0..{n - 1}")
    if len(set(heads)) < len(heads):  # else the same head is drawn twice, as if two heads agreed
        raise ValueError(f"heads={heads!r}: a head is named twice")
    return heads


def _ticks(tokens: list, room: int):
    """(positions, labels) for an axis of `tokens` with room for `room` labels; None beyond _LABELLED."""
    n = len(tokens)
    if n > _LABELLED:
        return None  # token text is unreadable here: matplotlib's numeric positions instead
    step = math.ceil(n / max(1, room))
    return list(range(0, n, step)), [str(tokens[i]) for i in range(0, n, step)]


def _draw(probs: torch.Tensor, heads: list, g, layer: int, title: str):
    """The figure: a grid of heatmaps sharing a colour scale, and one colour bar."""
    from matplotlib.figure import Figure  # imported here: the HTML writer must not pay for matplotlib

    cols = math.ceil(math.sqrt(len(heads)))
    rows = math.ceil(len(heads) / cols)
    n = max(len(g.rows), len(g.cols))
    panel = max(2.6, min(9.0, 0.11 * n + 1.0)) if len(heads) == 1 else max(2.2, min(3.4, 0.08 * n + 1.2))
    fontsize = 8 if len(heads) == 1 else 6
    fig = Figure(figsize=(cols * panel + 1.2, rows * panel + 0.8), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    vmax = float(probs[heads].max()) or 1.0
    for i, (ax, h) in enumerate(zip(axes.flat, heads)):
        image = ax.imshow(probs[h].numpy(), cmap="Blues", vmin=0.0, vmax=vmax, interpolation="nearest")
        _label(ax, g, int(panel * 72 / (fontsize * 1.3)), fontsize, show_y=i % cols == 0)
        ax.set_title(f"head {h}", fontsize=fontsize + 2)
    for ax in list(axes.flat)[len(heads):]:
        ax.set_axis_off()
    fig.colorbar(image, ax=axes, shrink=0.8 if rows > 1 else 0.9, label="attention weight")
    name = f"{title} · " if title else ""
    # wrapped to the figure's width: one head's narrow figure cut a citation title off at both ends
    width = int(fig.get_figwidth() * 72 / (11 * 0.6))
    fig.suptitle(textwrap.fill(f"{name}{g.name} attention, layer {layer}", max(width, 20)), fontsize=11)
    return fig


def _label(ax, g, room: int, fontsize: int, show_y: bool) -> None:
    """Token labels on a heatmap's axes: keys across the top, queries down the left."""
    ax.xaxis.tick_top()
    ax.tick_params(labelsize=fontsize, length=2, pad=1)
    x, y = _ticks(g.cols, room), _ticks(g.rows, room)
    if x:
        ax.set_xticks(x[0], x[1], rotation=90)
    if y:
        ax.set_yticks(y[0], y[1] if show_y else [])
    elif not show_y:
        ax.tick_params(labelleft=False)
    ax.set_xlabel("key", fontsize=fontsize + 1)
    ax.xaxis.set_label_position("top")
    if show_y:
        ax.set_ylabel("query", fontsize=fontsize + 1)
