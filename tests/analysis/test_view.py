"""The attention page is one self-contained file whose embedded data decodes (here, in Python, apart
from the page's own script) to the input within float16 / uint8 quantisation; top-k rows keep the
biggest weights; 512 tokens x 24 layers x 16 heads fit in 10 MB; figures; bad options refused."""
import base64
import json
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from lmforge.analysis.maps import AttentionGroup, AttentionMaps, random_maps
from lmforge.analysis.view import write_figure, write_html
from lmforge.analysis.view_figure import _ticks


class Lazy(Sequence):
    """Layers made on access, so a 24-layer, 512-token test never holds 1.6 GB of probabilities."""

    def __init__(self, n, make):
        self.n, self.make = n, make

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.make(i)


def peaked_layer(T: int, H: int, layer: int, seed: int = 0) -> torch.Tensor:
    """(H, T, T) attention shaped like BERT's (Clark et al. 2019): heads on the previous or next
    token, on [CLS], on [SEP], or broad, over noise; a cheap stand-in for a real model's maps."""
    g = torch.Generator().manual_seed(seed * 1000 + layer)
    logits = torch.randn(H, T, T, generator=g)
    i = torch.arange(T)
    for h in range(H):
        kind = (h + layer) % 5
        if kind == 0:
            logits[h, i[1:], i[:-1]] += 9
        elif kind == 1:
            logits[h, i[:-1], i[1:]] += 9
        elif kind in (2, 3):
            logits[h, :, 0 if kind == 2 else -1] += 9
    return torch.softmax(logits, -1)


def peaked_maps(T=512, n_layers=24, H=16, dh=64) -> AttentionMaps:
    """A long input's maps, with q and k, every layer made on access."""
    tokens = ["[CLS]"] + [f"tok{i}" for i in range(T - 2)] + ["[SEP]"]
    qk = lambda s: Lazy(n_layers, lambda l: torch.randn(H, T, dh,
                                                        generator=torch.Generator().manual_seed(s + l)))
    group = AttentionGroup("self", tokens, tokens, list(range(n_layers)),
                           Lazy(n_layers, lambda l: peaked_layer(T, H, l)), qk(100), qk(200), dh ** -0.5)
    return AttentionMaps([group], title="peaked", segments=[0] * T, meta={"family": "bert"})


def decode(path):
    """(meta, {block id: bytes}) of a written page."""
    text = path.read_text(encoding="utf-8")
    meta = json.loads(re.search(r'<script type="application/json" id="lmf-meta">(.*?)</script>', text,
                                re.S)[1])
    blocks = {m[1]: base64.b64decode(m[2]) for m in
              re.finditer(r'<script type="application/octet-stream" id="([\w-]+)">([^<]*)</script>', text)}
    return meta, blocks


def attention(meta, blocks, g, li):
    """Layer entry li of group g as a dense (H, Tq, Tk) array, and its top-k key indices (or None)."""
    G = meta["groups"][g]
    H, Tq, Tk, k, data = G["heads"][li], len(G["rows"]), len(G["cols"]), G["k"], blocks[f"b{g}-{li}-a"]
    if k is None:
        assert len(data) == 2 * H * Tq * Tk
        return np.frombuffer(data, "<f2").astype(np.float32).reshape(H, Tq, Tk), None
    assert len(data) == 3 * H * Tq * k
    idx = np.frombuffer(data[:2 * H * Tq * k], "<u2").reshape(H, Tq, k).astype(np.int64)
    w = np.frombuffer(data[2 * H * Tq * k:], np.uint8).reshape(H, Tq, k) / 255
    dense = np.zeros((H, Tq, Tk), np.float32)
    np.put_along_axis(dense, idx, w, -1)
    return dense, idx


def test_the_page_is_self_contained(tmp_path):
    write_html(random_maps(cross=True), tmp_path / "v.html")
    text = (tmp_path / "v.html").read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    for banned in ("http://", "https://", "//cdn", "<link", "@import", "url(", "<iframe"):
        assert banned not in text, banned
    assert not re.search(r"""\b(src|href)\s*=""", text)
    # style and every script inlined: the page's script is in the file, not referenced
    assert "const META = JSON.parse" in text and ".toolbar" in text and "{{" not in text


def test_small_maps_round_trip_exactly_in_float16(tmp_path):
    maps = random_maps(n_layers=2, n_heads=3, length=7, dh=4, cross=True)
    maps.groups[2].cols = maps.groups[2].cols[:5]  # cross attention over a shorter source
    maps.groups[2].probs = [torch.softmax(torch.randn(3, 7, 5), -1) for _ in range(2)]
    maps.groups[2].keys = [k[:, :5] for k in maps.groups[2].keys]
    stats = write_html(maps, tmp_path / "v.html")
    assert stats["top_k"] is None and not stats["truncated"] and \
        stats["bytes"] == (tmp_path / "v.html").stat().st_size
    meta, blocks = decode(tmp_path / "v.html")
    assert [G["name"] for G in meta["groups"]] == ["encoder", "decoder", "cross"]
    for g, group in enumerate(maps.groups):
        G = meta["groups"][g]
        assert G["rows"] == group.rows and G["cols"] == group.cols and G["layers"] == [0, 1]
        for li in range(2):
            got, _ = attention(meta, blocks, g, li)
            np.testing.assert_allclose(got, group.probs[li].numpy(), rtol=1e-3, atol=1e-6)
            qk = np.frombuffer(blocks[f"b{g}-{li}-q"], "<f2").astype(np.float32)
            want = np.concatenate([group.queries[li].numpy().ravel(), group.keys[li].numpy().ravel()])
            np.testing.assert_allclose(qk, want, rtol=1e-3, atol=1e-4)
    assert meta["notes"][0] == "Every attention weight is stored (float16)."


def test_truncated_rows_keep_their_biggest_weights(tmp_path):
    maps = random_maps(n_layers=3, n_heads=4, length=64, dh=8)
    for li in range(3):
        maps.groups[0].probs[li] = peaked_layer(64, 4, li)
    stats = write_html(maps, tmp_path / "v.html", max_bytes=140_000)
    assert stats["truncated"] and 1 <= stats["top_k"] < 43 and stats["bytes"] <= 140_000
    meta, blocks = decode(tmp_path / "v.html")
    k = meta["groups"][0]["k"]
    assert k == stats["top_k"] and f"top {k} keys" in " ".join(meta["notes"])
    masses = []
    for li in range(3):
        p = maps.groups[0].probs[li].numpy()
        got, idx = attention(meta, blocks, 0, li)
        kept = np.take_along_axis(p, idx, -1)
        dropped = p.copy()
        np.put_along_axis(dropped, idx, -1.0, -1)
        assert (kept.min(-1) >= dropped.max(-1) - 1e-7).all()  # no dropped key outweighs a kept one
        assert np.abs(np.take_along_axis(got, idx, -1) - kept).max() <= 0.5 / 255 + 1e-6
        masses.append(kept.sum(-1).ravel())
    masses = np.concatenate(masses)
    assert stats["mass_min"] == pytest.approx(masses.min(), abs=1e-5)
    assert stats["mass_mean"] == pytest.approx(masses.mean(), abs=1e-5)
    assert f"at least {masses.min():.1%}" in meta["notes"][0]


def test_q_and_k_are_kept_for_spread_layers_when_not_all_fit(tmp_path):
    maps = random_maps(n_layers=8, n_heads=4, length=32, dh=64)
    stats = write_html(maps, tmp_path / "v.html", max_bytes=250_000)
    meta, blocks = decode(tmp_path / "v.html")
    kept = stats["qk_layers"]["self"]
    assert not stats["truncated"] and 1 <= len(kept) < 8 and kept[0] == 0 and kept[-1] == 7
    assert meta["groups"][0]["qk"] == [li in kept for li in range(8)]
    assert {b for b in blocks if b.endswith("-q")} == {f"b0-{li}-q" for li in kept}
    assert any("kept for layers self" in n for n in meta["notes"])
    stats = write_html(maps, tmp_path / "w.html", max_bytes=110_000)
    assert stats["qk_layers"]["self"] == [] and stats["bytes"] <= 110_000
    assert any("neuron view is unavailable" in n for n in decode(tmp_path / "w.html")[0]["notes"])


def test_a_long_input_fits_ten_megabytes(tmp_path):
    start = time.perf_counter()
    stats = write_html(peaked_maps(), tmp_path / "long.html")
    took = time.perf_counter() - start
    assert stats["bytes"] == (tmp_path / "long.html").stat().st_size <= 10_000_000
    assert stats["bytes"] > 8_000_000  # the budget is used, not wasted
    assert stats["truncated"] and stats["top_k"] >= 10, stats
    assert 0.5 < stats["mass_mean"] < 1 and 0 < stats["mass_min"] < stats["mass_mean"], stats
    meta, blocks = decode(tmp_path / "long.html")
    assert len([b for b in blocks if b.endswith("-a")]) == 24 and meta["groups"][0]["heads"] == [16] * 24
    got, idx = attention(meta, blocks, 0, 5)
    p = peaked_layer(512, 16, 5).numpy()
    assert (np.take_along_axis(p, idx[..., :1], -1)[..., 0] == p.max(-1)).all()
    assert took < 60, took


def test_figures_are_written_as_png_and_svg(tmp_path):
    import matplotlib.image

    maps = random_maps(n_layers=2, n_heads=4, length=12)
    one = write_figure(maps, tmp_path / "one.png", layer=1, heads=[2])
    grid = write_figure(maps, tmp_path / "grid.png", layer=1)
    a, b = matplotlib.image.imread(one), matplotlib.image.imread(grid)
    assert a.std() > 0.05 and b.std() > 0.05  # something drawn, not a blank canvas
    assert b.shape[0] * b.shape[1] > a.shape[0] * a.shape[1]  # four panels take more room than one
    svg = write_figure(maps, tmp_path / "f.svg", layer=0, heads=[0, 1])
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg") and len(list(root.iter())) > 100
    cross = random_maps(n_layers=1, n_heads=2, length=100, cross=True)
    long = write_figure(cross, tmp_path / "long.png", group="cross", layer=0)
    assert matplotlib.image.imread(long).std() > 0.05



def test_a_long_title_stays_inside_a_one_head_figure():
    """A citation title (the presets') over one narrow head is wrapped, not cut off at both edges."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from lmforge.analysis.view_figure import _draw, selection

    maps = random_maps(n_layers=1, n_heads=2, length=8)
    maps.title = "Devlin et al. 2019, BERT, sec. 3 (BERT-BASE)"
    g, probs, heads = selection(maps, layer=0, heads=[1])
    fig = _draw(probs, heads, g, 0, maps.title)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)  # lays the figure out (constrained layout) as saving would
    box = fig._suptitle.get_window_extent(renderer)
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width

def test_a_figure_without_a_layer_draws_the_first_one_recorded():
    from lmforge.analysis.view_figure import selection

    maps = random_maps(n_layers=3, n_heads=2, length=6)
    group = maps.groups[0]
    group.layers, group.probs = group.layers[1:], group.probs[1:]  # as --layers 1-2 records them
    _, probs, _ = selection(maps)
    assert torch.equal(probs, torch.as_tensor(group.probs[0]).float())


def test_token_labels_thin_then_give_way_to_positions():
    tokens = [f"t{i}" for i in range(60)]
    assert _ticks(tokens, 100) == (list(range(60)), tokens)
    positions, labels = _ticks(tokens, 20)
    assert len(labels) <= 20 and labels[0] == "t0" and positions == list(range(0, 60, 3))
    assert _ticks([f"t{i}" for i in range(81)], 100) is None


def _bad_group():
    maps = random_maps()
    maps.groups[0].probs[1] = torch.rand(3, 7, 6)
    return maps


@pytest.mark.parametrize("kwargs, match", [
    ({"max_bytes": 0}, "max_bytes"), ({"max_bytes": "10MB"}, "max_bytes"), ({"max_bytes": True}, "max_bytes"),
    ({"max_bytes": 20_000}, "max_bytes=20000 is too small"),
])
def test_bad_page_options_are_refused(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        write_html(random_maps(), tmp_path / "v.html", **kwargs)
    assert not (tmp_path / "v.html").exists()


def test_malformed_maps_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no attention groups"):
        write_html(AttentionMaps([]), tmp_path / "v.html")
    with pytest.raises(ValueError, match=r"group 'self' layer 1: probs \(3, 7, 6\)"):
        write_html(_bad_group(), tmp_path / "v.html")


@pytest.mark.parametrize("kwargs, match", [
    ({"path": "f.jpg"}, "^path: "), ({"group": "cross"}, "^group='cross'"), ({"layer": 5}, "^layer=5"),
    ({"heads": [3]}, r"^heads=\[3\]"), ({"heads": []}, r"^heads=\[\]"), ({"layer": "0"}, "^layer='0'"),
    ({"heads": [1, 1]}, r"^heads=\[1, 1\]: a head is named twice"),
])
def test_bad_figure_options_are_refused(tmp_path, kwargs, match):
    path = tmp_path / kwargs.pop("path", "f.png")
    with pytest.raises(ValueError, match=match):
        write_figure(random_maps(), path, **kwargs)
    assert not path.exists()
