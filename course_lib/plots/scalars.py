"""Scalars per rank: lines over steps, bars per rank, and one run against a reference run."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from course_lib.plots.style import (
    BLACK,
    BLUE,
    ORANGE,
    chosen_ranks,
    new_figure,
    rank_bar_style,
    rank_style,
    require,
    step_axis,
)
from course_lib.telemetry import Telemetry

FLOOR = 1e-12  # differences of exactly 0 are drawn here on the log scale


def scalars(tel: Telemetry, *names: str, ranks: list[int] | None = None,
            title: str | None = None) -> Figure:
    """One panel per scalar name (default: all), one line per rank over steps."""
    require(len(tel.scalars), "scalars", "call rec.scalar(name, value)")
    names = names or tuple(tel.scalars.unique("name"))
    fig = new_figure(9, 1.2 + 2.6 * len(names))
    axes = np.atleast_1d(fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0])
    for ax, name in zip(axes, names):
        table = tel.scalars.where(name=name)
        for rank in chosen_ranks(tel, ranks):
            rows = table.where(rank=rank)
            ax.plot(rows["step"], rows["value"], label=f"rank {rank}", ms=4,
                    markevery=max(1, len(rows) // 25), **rank_style(rank))
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    step_axis(axes[-1])
    fig.suptitle(title or f"{', '.join(names)} per rank\n"
                 "One visible line = the ranks agree; separate lines = they differ")
    return fig


def rank_bars(tel: Telemetry, name: str, step: int | None = None,
              title: str | None = None) -> Figure:
    """One bar per rank: the scalar `name` at `step` (default: the last step), summed over
    the step's records (a scalar recorded twice in a step counts twice)."""
    table = tel.scalars.where(name=name)
    require(len(table), f"scalar {name!r}", f"call rec.scalar({name!r}, value)")
    step = int(table["step"].max()) if step is None else step
    ranks = sorted(set(table.where(step=step)["rank"].tolist()))
    totals = [float(table.where(step=step, rank=r)["value"].sum()) for r in ranks]
    fig = new_figure(1.5 + 1.2 * max(2, len(ranks)), 3.6)
    ax = fig.subplots()
    for i, (rank, total) in enumerate(zip(ranks, totals)):
        bars = ax.bar(i, total, width=0.6, label=f"rank {rank}", **rank_bar_style(rank))
        ax.bar_label(bars, [f"{total:g}"])
    ax.set_xticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_xlim(-0.6, max(2, len(ranks)) - 0.4)
    ax.set_ylabel(name)
    ax.set_title(title or f"{name} per rank at step {step}")
    return fig


def compare_runs(reference: Telemetry, other: Telemetry, names: Sequence[str] = ("loss",),
                 tol: float = 1e-6, labels: tuple[str, str] = ("reference", "other")) -> Figure:
    """Per scalar: both runs over steps (each the mean over its ranks), and their absolute
    difference on a log scale against the tolerance `tol`."""
    fig = new_figure(min(8.4, 4 + 4 * len(names)), 6)  # at most JupyterLab's output width
    axes = fig.subplots(2, len(names), sharex=True, squeeze=False)
    for col, name in enumerate(names):
        (steps, ref), (_, oth) = _mean_per_step(reference, name), _mean_per_step(other, name)
        if len(ref) != len(oth):
            raise ValueError(f"{name!r}: the runs recorded different steps")
        top, bottom = axes[0, col], axes[1, col]
        top.plot(steps, ref, color=BLUE, linestyle="-", lw=3, label=labels[0])
        top.plot(steps, oth, color=ORANGE, linestyle="--", marker="s", ms=4, label=labels[1])
        top.set_title(name)
        bottom.semilogy(steps, np.maximum(np.abs(ref - oth), FLOOR), color=BLACK, marker="o",
                        ms=4, label="|difference|")
        bottom.axhline(tol, color=BLACK, linestyle=":", label=f"tolerance {tol:g}")
        bottom.set_ylim(FLOOR / 3, max(tol * 30, np.max(np.abs(ref - oth), initial=0) * 3))
        step_axis(bottom)
    handles = [h for ax in axes[:, 0] for h in ax.get_legend_handles_labels()[0]]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize="small")
    fig.suptitle(f"{labels[1]} against {labels[0]}\nThey match where the difference "
                 f"(bottom) stays under the dotted tolerance line\n(0 is drawn at {FLOOR:g})")
    return fig


def _mean_per_step(tel: Telemetry, name: str) -> tuple[np.ndarray, np.ndarray]:
    table = tel.scalars.where(name=name)
    require(len(table), f"scalar {name!r}", f"call rec.scalar({name!r}, value)")
    steps = np.unique(table["step"])
    return steps, np.array([table["value"][table["step"] == s].mean() for s in steps])
