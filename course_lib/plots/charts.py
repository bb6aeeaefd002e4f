"""Generic charts that teaching modules compose: one line per run, one bar per run, and the
style of the i-th series. Each draws plain numbers (no Telemetry), so a lesson's picture
is its data plus one call, and every chart of the course keeps one look.

    fig = lines({"no accumulation": losses_a, "k = 4": losses_b}, ylabel="loss", log=True)
    fig = bars({"1 MiB": 12.3, "25 MiB": 9.8}, ylabel="ms per step", fmt="{:.1f}")

Both take `ax=` to draw into an existing Axes (a panel of a larger figure); they return the
Axes' Figure either way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from course_lib.plots.style import HIGHLIGHT, new_figure, rank_bar_style, rank_style, step_axis


def series_style(i: int, *, markers: bool = True) -> dict[str, Any]:
    """Line keywords (color, linestyle, marker) of the i-th series: the look of rank i, so
    that series stay apart for colour-blind readers and in greyscale, for any i. Without
    `markers` (a step plot, a dense curve) the marker is turned off."""
    return rank_style(i) if markers else {**rank_style(i), "marker": ""}


def bar_style(i: int) -> dict[str, Any]:
    """Bar keywords (color, hatch, edgecolor) of the i-th bar: the look of rank i."""
    return rank_bar_style(i)


def _axes(ax: Axes | None, width: float, height: float) -> Axes:
    return ax if ax is not None else new_figure(width, height).subplots()


def _require(values: Mapping[str, Any], chart: str) -> None:
    if not values:
        raise ValueError(f"{chart}() got no runs to draw: pass a dict of run name -> values")


def first_non_finite(values: Sequence[float]) -> int | None:
    """The index of the first inf or nan in `values`, or None."""
    return next((i for i, v in enumerate(values) if not math.isfinite(v)), None)


def lines(curves: Mapping[str, Sequence[float]], *, ylabel: str = "loss", title: str = "",
          xlabel: str = "step", log: bool = False, markersize: float = 3,
          first_step: int = 0, nested: bool = False, ax: Axes | None = None) -> Figure:
    """One line per run against its step (`first_step`, then +1 each), each in its series
    style, with a legend. A run that reached inf or nan stops there and ends in a red cross
    at the top of the chart, labelled with its step: matplotlib would leave a silent gap
    instead. `nested`, for runs that should coincide: hollow markers, each run's 2 points
    smaller than the one before, so that every run stays visible on top of the others."""
    _require(curves, "lines")
    ax = _axes(ax, 7, 3.2)
    finite = [v for vs in curves.values() for v in vs if math.isfinite(v) and (v > 0 or not log)]
    top = max(finite) * (3 if log else 1.1) if finite else 1.0
    crosses = 0
    for i, (name, values) in enumerate(curves.items()):
        end = first_non_finite(values)
        shown = list(values if end is None else values[:end])
        size = markersize + 2 * (len(curves) - 1 - i) if nested else markersize
        ax.plot(range(first_step, first_step + len(shown)), shown, label=name, markersize=size,
                fillstyle="none" if nested else "full", **series_style(i))
        if end is not None:
            ax.plot([first_step + end], [top], "x", color=HIGHLIGHT, ms=10, mew=2.5)
            ax.annotate(f"{name}: inf/nan from step {first_step + end}", (first_step + end, top),
                        textcoords="offset points", xytext=(8, -12 - 11 * crosses),
                        fontsize="x-small", color=HIGHLIGHT)
            crosses += 1
    if log:
        ax.set_yscale("log")
    step_axis(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small")
    return ax.figure


def bars(values: Mapping[str, float], *, ylabel: str, title: str = "", fmt: str = "{:.1f}",
         log: bool = False, highlight: Iterable[str] = (), ax: Axes | None = None) -> Figure:
    """One bar per run, in its bar style, labelled with its value (`fmt`); the runs named
    in `highlight` get a red edge (the one that shows the problem)."""
    _require(values, "bars")
    ax = _axes(ax, 6.5, 3.0)
    marked = set(highlight)
    unknown = marked - set(values)
    if unknown:
        raise ValueError(f"bars(highlight=...) names {sorted(unknown)}, which are not among "
                         f"the runs {list(values)}")
    drawn = ax.bar(range(len(values)), list(values.values()))
    for i, (bar, name) in enumerate(zip(drawn, values)):
        bar.set(**bar_style(i))
        if name in marked:
            bar.set(edgecolor=HIGHLIGHT, linewidth=2.5)
    ax.bar_label(drawn, [fmt.format(v) for v in values.values()], fontsize="small")
    ax.set_xticks(range(len(values)), list(values), fontsize="small")
    if log:
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, max(max(values.values()) * 1.25, 0) or 1)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize="medium")
    return ax.figure
