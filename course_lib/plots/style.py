"""Styles every plot shares: rank colours that survive colour blindness and greyscale
(Okabe-Ito colours, each rank also with its own line style, marker and hatch)."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from course_lib.telemetry import Telemetry

# Okabe-Ito; vermillion is kept for highlighting problems.
BLUE, ORANGE, GREEN, PURPLE = "#0072B2", "#E69F00", "#009E73", "#CC79A7"
SKY, YELLOW, BLACK, VERMILLION = "#56B4E9", "#F0E442", "#000000", "#D55E00"
RANK_COLORS = (BLUE, ORANGE, GREEN, PURPLE, SKY, BLACK, YELLOW)
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
HATCHES = ("", "//", "..", "xx", "\\\\", "++", "oo")
HIGHLIGHT = VERMILLION


def rank_style(rank: int) -> dict[str, Any]:
    """Line keywords (color, linestyle, marker) for one rank."""
    return {"color": RANK_COLORS[rank % len(RANK_COLORS)],
            "linestyle": LINESTYLES[rank % len(LINESTYLES)],
            "marker": MARKERS[rank % len(MARKERS)]}


def rank_bar_style(rank: int) -> dict[str, Any]:
    """Bar keywords (color, hatch, edgecolor) for one rank."""
    return {"color": RANK_COLORS[rank % len(RANK_COLORS)],
            "hatch": HATCHES[rank % len(HATCHES)], "edgecolor": BLACK}


def new_figure(width: float, height: float) -> Figure:
    """A figure Jupyter shows once: made through pyplot (so it renders), then closed."""
    fig = plt.figure(figsize=(width, height), layout="constrained")
    plt.close(fig)
    return fig


def step_axis(ax: Axes) -> None:
    """Label an x axis of training steps, with whole-number ticks."""
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def chosen_ranks(tel: Telemetry, ranks: list[int] | None) -> list[int]:
    """The ranks to draw: all of the run's ranks unless a list is given."""
    return list(tel.ranks) if ranks is None else [r for r in ranks if r in tel.ranks]


def require(rows: int, what: str, how: str) -> None:
    """Explain what to record when a plot has nothing to draw."""
    if not rows:
        raise ValueError(f"no {what} in this telemetry: {how} in the training function")
