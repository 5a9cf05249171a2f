"""The attention view: one self-contained HTML page (head, model and neuron views) of AttentionMaps.

After BertViz (Vig 2019, "A Multiscale Visualization of Attention in the Transformer Model"), but
offline: the script and style in assets/ are inlined and the data is embedded, one base64 block per
layer and group that the page decodes only when that layer is shown. A block holds the layer's
probabilities as float16 (H, Tq, Tk) when the byte budget allows, else each row's top-k keys
(uint16 key index, then uint8 weight); q and k for the neuron view are float16 and kept for as many
layers as the budget leaves room for. The page says what was cut.
"""
from __future__ import annotations

import base64
import html
import json
import re
from importlib import resources

import torch

from lmforge.analysis.maps import AttentionMaps, truncation_note
from lmforge.analysis.view_figure import write_figure
from lmforge.utils.atomic import atomic_write_bytes

__all__ = ["write_html", "write_figure"]

SCRIPTS = ("data.js", "head.js", "model.js", "neuron.js", "selftest.js", "app.js")  # inlined in this order
QK_SHARE = 0.2  # of the budget q and k may claim before attention picks its k
_WRAP = len('<script type="application/octet-stream" id="b00-0000-a"></script>\n')
_NOTE_ROOM = 1200  # bytes kept for the notes, which are written after the plan
_MAX_KEYS = 65535  # key indices are uint16


def write_html(maps: AttentionMaps, path, max_bytes: int = 10_000_000) -> dict:
    """Write the attention page of `maps` to `path` (at most `max_bytes`); return what was stored."""
    shapes = _check(maps, max_bytes)
    fixed = len(_page(maps, _meta(maps, shapes, None, set(), ["x" * _NOTE_ROOM])).encode())
    k, qk = _plan(shapes, max_bytes - fixed)
    if k == 0:
        need = fixed + _attention_cost(shapes, 1)
        raise ValueError(f"max_bytes={max_bytes} is too small: this page needs at least {need} bytes")
    blocks, mass = _blocks(maps, shapes, k, qk)
    notes = _notes(maps, shapes, k, qk, mass, max_bytes)
    data = _page(maps, _meta(maps, shapes, k, qk, notes), blocks).encode()
    if len(data) > max_bytes:  # the plan counts every byte, so this is a bug, not bad input
        raise RuntimeError(f"attention page is {len(data)} bytes, over its plan of {max_bytes}")
    atomic_write_bytes(path, data)
    truncated = any(_stored_k(k, tk) is not None for group in shapes for _, _, tk, _ in group)
    return {"path": str(path), "bytes": len(data), "max_bytes": max_bytes,
            "top_k": k if truncated else None, "truncated": truncated,
            "mass_mean": mass["mean"], "mass_min": mass["min"],
            "qk_layers": {g.name: [g.layers[li] for gi, li in sorted(qk) if maps.groups[gi] is g]
                          for g in maps.groups},
            "groups": [g.name for g in maps.groups]}


def _check(maps: AttentionMaps, max_bytes) -> list:
    """Validate the input; per group, per layer: (H, Tq, Tk, dh), dh 0 where q and k are absent."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"max_bytes must be a positive integer, got {max_bytes!r}")
    if not maps.groups:
        raise ValueError("maps: no attention groups to show")
    return [[_layer_shape(g, li) for li in range(len(g.probs))] for g in maps.groups]


def _layer_shape(g, li: int) -> tuple:
    """(H, Tq, Tk, dh) of layer entry `li` of group `g`, checked against its tokens."""
    tq, tk = len(g.rows), len(g.cols)
    if len(g.layers) != len(g.probs) or not g.probs:
        raise ValueError(f"group {g.name!r}: {len(g.layers)} layer numbers for {len(g.probs)} layers")
    if tk > _MAX_KEYS or not tq or not tk:
        raise ValueError(f"group {g.name!r}: {tq} x {tk} tokens; a view takes 1 to {_MAX_KEYS}")
    shape = tuple(g.probs[li].shape)
    if len(shape) != 3 or shape[1:] != (tq, tk):
        raise ValueError(f"group {g.name!r} layer {g.layers[li]}: probs {shape}, want (H, {tq}, {tk})")
    q = g.queries[li] if g.queries is not None and g.keys is not None else None
    if q is None:
        return shape[0], tq, tk, 0
    kk = g.keys[li]
    if tuple(q.shape)[:2] != shape[:2] or tuple(kk.shape) != (shape[0], tk, q.shape[-1]):
        raise ValueError(f"group {g.name!r} layer {g.layers[li]}: q {tuple(q.shape)} and k "
                         f"{tuple(kk.shape)} do not match probs {shape}")
    return shape[0], tq, tk, int(q.shape[-1])


def _b64(n: int) -> int:
    """Bytes a block of n binary bytes takes in the page."""
    return 4 * ((n + 2) // 3) + _WRAP


def _stored_k(k, tk: int):
    """Keys stored per row: None (all, float16) when k is None or top-k would not be smaller."""
    return None if k is None or 3 * k >= 2 * tk else k


def _attention_cost(shapes: list, k) -> int:
    """Page bytes of every attention block when rows keep `k` keys (None: all)."""
    total = 0
    for group in shapes:
        for h, tq, tk, _ in group:
            kept = _stored_k(k, tk)
            total += _b64(2 * h * tq * tk if kept is None else 3 * h * tq * kept)
    return total


def _spread(shapes: list) -> list:
    """Every (group, layer) holding q and k, ordered to spread: first, last, middle, quarters, ..."""
    orders = []
    for group in shapes:
        n, order, denom = len(group), [], 1
        while len(order) < n:
            for num in range(denom + 1):
                li = round(num * (n - 1) / denom)
                if li not in order:
                    order.append(li)
            denom *= 2
        orders.append(order)
    ranked = [(r, gi, li) for gi, order in enumerate(orders) for r, li in enumerate(order)]
    return [(gi, li) for _, gi, li in sorted(ranked) if shapes[gi][li][3]]


def _qk_cost(shapes: list, key: tuple) -> int:
    """Page bytes of one layer's q and k (float16)."""
    h, tq, tk, dh = shapes[key[0]][key[1]]
    return _b64(2 * h * (tq + tk) * dh)


def _fill(candidates: list, shapes: list, room: float, chosen: set) -> set:
    """`chosen` plus the candidates, in order, whose q and k still fit in `room`."""
    chosen = set(chosen)
    for key in candidates:
        cost = _qk_cost(shapes, key)
        if key not in chosen and cost <= room:
            chosen.add(key)
            room -= cost
    return chosen


def _largest_k(shapes: list, room: int) -> int:
    """The most keys per row whose attention blocks fit in `room` (0 when not even one does)."""
    lo, hi = 0, max(tk for group in shapes for _, _, tk, _ in group)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _attention_cost(shapes, mid) <= room else (lo, mid - 1)
    return lo


def _plan(shapes: list, room: int) -> tuple:
    """(k, qk): keys per row (None: all; 0: nothing fits) and the (group, layer) pairs keeping q and k."""
    candidates = _spread(shapes)
    qk_total = sum(_qk_cost(shapes, key) for key in candidates)
    if _attention_cost(shapes, None) + qk_total <= room:
        return None, set(candidates)
    qk = _fill(candidates, shapes, QK_SHARE * room, set())
    k = _largest_k(shapes, room - sum(_qk_cost(shapes, key) for key in qk))
    if k == 0:
        qk, k = set(), _largest_k(shapes, room)
    if k == 0:
        return 0, set()
    left = room - _attention_cost(shapes, k) - sum(_qk_cost(shapes, key) for key in qk)
    return k, _fill(candidates, shapes, left, qk)


def _encode_attention(p, k):
    """A layer's attention block, and each row's kept share of its mass (None when all is kept)."""
    p = torch.as_tensor(p).detach().to("cpu", torch.float32)
    if k is None:
        return p.numpy().astype("<f2").tobytes(), None
    w, idx = torch.topk(p, k, dim=-1)  # (H, Tq, k), biggest first
    total = p.sum(-1)
    kept = (w.sum(-1) / total.clamp_min(1e-30))[total > 0]  # rows with no keys at all carry nothing
    w8 = (w * 255).round().clamp(0, 255).to(torch.uint8)
    return idx.numpy().astype("<u2").tobytes() + w8.numpy().tobytes(), kept


def _encode_qk(q, k) -> bytes:
    """A layer's q then k, float16."""
    q, k = (torch.as_tensor(x).detach().to("cpu", torch.float32).numpy().astype("<f2") for x in (q, k))
    return q.tobytes() + k.tobytes()


def _blocks(maps: AttentionMaps, shapes: list, k, qk: set) -> tuple:
    """Every data block of the page, and the kept mass of truncated rows: {"mean", "min"}."""
    blocks, kept_sum, kept_n, kept_min = [], 0.0, 0, 1.0
    for gi, g in enumerate(maps.groups):
        for li in range(len(g.probs)):
            data, kept = _encode_attention(g.probs[li], _stored_k(k, shapes[gi][li][2]))
            blocks.append(_block(f"b{gi}-{li}-a", data))
            if kept is not None and kept.numel():
                kept_sum, kept_n = kept_sum + float(kept.double().sum()), kept_n + kept.numel()
                kept_min = min(kept_min, float(kept.min()))
            if (gi, li) in qk:
                blocks.append(_block(f"b{gi}-{li}-q", _encode_qk(g.queries[li], g.keys[li])))
    return blocks, {"mean": kept_sum / kept_n if kept_n else 1.0, "min": kept_min if kept_n else 1.0}


def _block(ident: str, data: bytes) -> str:
    """One embedded data block."""
    return (f'<script type="application/octet-stream" id="{ident}">'
            f'{base64.b64encode(data).decode()}</script>\n')


def _ranges(numbers: list) -> str:
    """1, 2, 3, 7 -> "1-3, 7"."""
    out, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append(str(n) if n == start else f"{start}-{n}")
            start = None
    return ", ".join(out)


def _notes(maps: AttentionMaps, shapes: list, k, qk: set, mass: dict, max_bytes: int) -> list:
    """What the page shows and what it cut to fit, one sentence each."""
    mb = f"{max_bytes / 1e6:g} MB"
    cut = [g.name for gi, g in enumerate(maps.groups) if _stored_k(k, shapes[gi][0][2]) is not None]
    if not cut:
        notes = ["Every attention weight is stored (float16)."]
    else:
        notes = [f"To fit {mb}, each row of {', '.join(cut)} keeps its top {k} keys (weights to 1/255): "
                 f"{mass['mean']:.1%} of a row's attention on average, at least {mass['min']:.1%}."]
    have = [(gi, li) for gi, group in enumerate(shapes) for li, s in enumerate(group) if s[3]]
    if not have:
        notes.append("The extraction kept no q and k: the neuron view is unavailable.")
    elif not qk:
        notes.append(f"q and k were left out to fit {mb}: the neuron view is unavailable.")
    elif len(qk) < len(have):
        kept = "; ".join(f"{g.name} {_ranges([g.layers[li] for gj, li in sorted(qk) if gj == gi])}"
                         for gi, g in enumerate(maps.groups) if any(gj == gi for gj, _ in qk))
        notes.append(f"The neuron view's q and k are kept for layers {kept}; the others were left out "
                     f"to fit {mb}.")
    return notes + [note for note in [truncation_note(maps)] if note]


def _meta(maps: AttentionMaps, shapes: list, k, qk: set, notes: list) -> dict:
    """What the page's script reads besides the blocks: tokens, layers, heads, encodings, notes."""
    groups = [{"name": g.name, "rows": [str(t) for t in g.rows], "cols": [str(t) for t in g.cols],
               "layers": [int(n) for n in g.layers], "heads": [s[0] for s in shapes[gi]],
               "dh": [s[3] for s in shapes[gi]], "qk": [(gi, li) in qk for li in range(len(g.probs))],
               "k": _stored_k(k, len(g.cols)), "scale": float(g.scale)}
              for gi, g in enumerate(maps.groups)]
    segments = [int(s) for s in maps.segments] if maps.segments is not None else None
    return {"title": maps.title, "meta": {str(a): str(b) for a, b in maps.meta.items()},
            "segments": segments, "groups": groups, "notes": notes}


def _asset(name: str) -> str:
    """The text of one file of assets/."""
    return resources.files("lmforge.analysis").joinpath("assets", name).read_text(encoding="utf-8")


def _page(maps: AttentionMaps, meta: dict, blocks: list = ()) -> str:
    """The page: the template with its style, data and script inlined."""
    data = json.dumps(meta, ensure_ascii=True, separators=(",", ":"))
    parts = {"title": html.escape(maps.title or "attention"), "css": _asset("view.css"),
             "meta": data.replace("<", "\\u003c"), "blocks": "".join(blocks),
             "js": "\n".join(_asset(name) for name in SCRIPTS)}
    # one pass, so nothing inserted (a token spelled "{{js}}") is itself replaced
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _asset("view.html"))
