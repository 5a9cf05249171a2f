"""The probes' figure: every probe visible at a single layer, whole-layer ticks, legends beside the panels."""
from __future__ import annotations

import math

from lmforge.analysis import probe_report


def _results(layers: list) -> dict:
    n = len(layers)
    probe = {"accuracy": [0.5] * n, "selectivity": [0.1] * n}
    return {"layers": layers, "baselines": {"right_branching_uuas": 0.4},
            "tasks": {"pos": {"mlp": dict(probe), "linear": dict(probe),
                              "cumulative": {"mix_weights": [1 / n] * n, "center_of_gravity": 1.0,
                                             "expected_layer": math.nan}},
                      "distance": {"uuas": [0.3] * n, "dspr": [0.2] * n}}}


def _figure(tmp_path, monkeypatch, layers):
    caught = []
    monkeypatch.setattr(probe_report, "atomic_savefig", lambda fig, path, dpi=None: caught.append(fig))
    probe_report.plot_probes(_results(layers), tmp_path / "probes.png", title="t")
    return caught[0]


def test_one_layer_draws_every_probe_as_a_marker_on_its_own_tick(tmp_path, monkeypatch):
    fig = _figure(tmp_path, monkeypatch, [2])
    accuracy, _, _, structural = fig.axes
    for ax in (accuracy, structural):
        assert [line.get_marker() for line in ax.lines if len(line.get_xdata()) == 1] == ["o", "s"]
    assert all(list(ax.get_xticks()) == [2] for ax in fig.axes)


def test_legends_sit_beside_their_panels_not_over_the_curves(tmp_path, monkeypatch):
    fig = _figure(tmp_path, monkeypatch, [0, 1, 2])
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    for ax in fig.axes:
        legend, box = ax.get_legend(), ax.get_window_extent(renderer)
        assert legend is not None and legend.get_window_extent(renderer).x0 >= box.x1
        assert legend.get_window_extent(renderer).x1 <= fig.bbox.width  # and not cut off


def test_a_negative_spearman_stays_inside_the_structural_panel(tmp_path, monkeypatch):
    results = _results([0, 1, 2])
    results["tasks"]["distance"]["dspr"] = [-0.4, 0.1, float("nan")]
    caught = []
    monkeypatch.setattr(probe_report, "atomic_savefig", lambda fig, path, dpi=None: caught.append(fig))
    probe_report.plot_probes(results, tmp_path / "probes.png")
    low, high = caught[0].axes[3].get_ylim()
    assert low < -0.4 and high == 1
