"""The rules every lmforge plot of a series against steps or compute shares.

The training log, the demo's panels and the bake-off's curves read them here, so a run's plots agree.
"""
from __future__ import annotations

# a series of at most this many points draws a marker on each: a line through one point draws nothing,
# and a few points joined by lines would read as more measurements than there are
SHORT_SERIES = 20


def series_style(points: int, line: str = "-") -> str:
    """The matplotlib format for a series of `points` points: `line` alone for a long one, markers
    joined by it for a short one."""
    return f"o{line}" if points <= SHORT_SERIES else line


def whole_steps(ax) -> None:
    """Whole steps on `ax`'s x axis (a short run had ticks at step 1.5), and a run of one or two steps
    shown with a step either side rather than across step 0.96 to 1.04."""
    from matplotlib.ticker import MaxNLocator

    low, high = ax.dataLim.intervalx
    if ax.lines and high - low < 2:
        ax.set_xlim(low - 1, high + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
