"""run_heads, the Python face of `lmforge heads`: an output folder that is a symbolic link is refused (as
the command line refuses it) before the model is read, and nothing is written where it points."""
import pytest

from lmforge.analysis.head_report import run_heads
from lmforge.utils.atomic import UnsafePath


def test_a_link_as_the_output_folder_is_refused_before_any_work(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(UnsafePath, match="out: is a symbolic link"):
        run_heads(tmp_path / "no-model", [], tmp_path / "out")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_one_level_curve_gets_a_percent_axis_with_importance_drawn_on_top(tmp_path, monkeypatch):
    """Only the unpruned level: the axis spans 0..100 % (not +-0.04 %), and the importance point, equal
    to random's there, is drawn over it rather than hidden under it."""
    from lmforge.analysis import head_report

    caught = []
    monkeypatch.setattr(head_report, "atomic_savefig", lambda fig, path: caught.append(fig.axes[0]))
    level = [{"fraction": 0.0, "metric": 0.9}]
    head_report.plot_curves({"importance": level, "random": level}, "accuracy", tmp_path / "heads.png")
    ax = caught[0]
    low, high = ax.get_xlim()
    assert low < 0 and high > 100 and ax.get_xlabel() == "heads pruned (%)" and ax.get_ylabel() == "accuracy"
    importance, random = ax.lines
    assert importance.get_zorder() > random.get_zorder()


@pytest.mark.parametrize("orders, labels", [(1, ["importance", "random"]),
                                            (3, ["importance", "random (mean of 3 orders)", "random ± 1 sd"])])
def test_the_random_band_is_drawn_and_named_only_for_several_orders(tmp_path, monkeypatch, orders, labels):
    from lmforge.analysis import head_report

    caught = []
    monkeypatch.setattr(head_report, "atomic_savefig", lambda fig, path: caught.append(fig.axes[0]))
    levels = [{"fraction": f, "metric": 0.9 - f} for f in (0.0, 0.5)]
    band = [{"fraction": f, "mean": 0.9 - f, "sd": 0.0 if orders == 1 else 0.1, "n": orders} for f in (0.0, 0.5)]
    head_report.plot_curves({"importance": levels}, "accuracy", tmp_path / "heads.png", band=band)
    assert [t.get_text() for t in caught[0].get_legend().get_texts()] == labels
