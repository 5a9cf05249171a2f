"""The plots' shared rules: markers on a short series, whole steps on a step axis."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lmforge.utils.plots import SHORT_SERIES, series_style, whole_steps  # noqa: E402


def test_a_short_series_draws_a_marker_on_each_point_and_a_long_one_a_line():
    """A one-point series is visible (a line through one point draws nothing); a long one is a line."""
    assert series_style(1) == "o-" and series_style(SHORT_SERIES) == "o-"
    assert series_style(SHORT_SERIES + 1) == "-" and series_style(SHORT_SERIES + 1, "--") == "--"


def test_a_step_axis_has_whole_ticks_and_a_single_step_a_step_either_side():
    """A run of one step shows steps 0..2 with integer ticks, not 0.96..1.04 in fractions."""
    fig, ax = plt.subplots()
    ax.plot([1], [0.5], series_style(1))
    whole_steps(ax)
    fig.canvas.draw()
    assert ax.get_xlim() == (0, 2)
    assert all(float(t).is_integer() for t in ax.get_xticks())
    plt.close(fig)
