"""Gradient accumulation under DDP, seen from real runs: what each optimizer step costs in
all-reduces, bytes and time, on a simulated slower link, and how far the ranks drift.

    rec.watch_ddp(model, hook=slow_link, state=link)  # a slower link, link = SlowLink(1)
    sync_cost(rec.telemetry(), link)    # all-reduces, bytes and seconds per optimizer step,
                                        # and of those seconds the link's (exact) and the rest
    plot_link_and_rest({"name": [cost, ...], ...})  # repeated runs: the link's part and the rest
    plot_sync_cost({"name": cost, ...}) # several runs, side by side
    accumulation_explorer(grid)         # sliders for k and the link's bandwidth

The link's seconds per step come from the run's own all-reduces, each at the time the
simulated link waits for it (Link.seconds, exact); the rest of the step is measured, and on a
shared machine it moves by more than a fast link's wait. The figures keep the two apart.

No `from __future__ import annotations`: DDP checks a comm hook's annotations at runtime.
"""

from typing import Any

import numpy as np

from course_lib.teach.scaling_model import Link
from course_lib.teach.simulated_link import simulated_link

MB = 1e6


class SlowLink(Link):
    """A link between ranks slower than this machine's loopback (lesson 08's Link: every
    all-reduce completes no sooner than the ring of ranks would carry it on this link)."""


slow_link = simulated_link  # DDP's average, delivered when the link has carried the bucket


def sync_cost(tel: Any, link: Link | None = None, rank: int | None = None
              ) -> dict[str, float]:
    """One rank's cost per optimizer step: the mean all-reduces and MB all-reduced, and the
    median seconds (one slow step on a shared machine does not move it), over the steps
    recorded with rec.step() (spans "step") and watch_ddp (table comms). Of those seconds,
    "link_seconds" is what the simulated `link` waited for this step's all-reduces (exact:
    link.seconds of each one's bytes; 0 without a link) and "rest_seconds" the measured rest
    (compute, the real all-reduce on loopback), both medians over the steps. `rank`: the
    telemetry's first rank unless given (a recorder's own telemetry has one)."""
    rank = min(tel.ranks, default=0) if rank is None else rank
    spans = tel.spans.where(rank=rank, name="step")
    if not len(spans):
        raise ValueError("no steps in this telemetry: wrap each optimizer step in "
                         "rec.step(step) and record with rec.watch_ddp(model)")
    comms = tel.comms.where(rank=rank)
    steps = list(spans["step"])
    sizes = [comms["bytes"][comms["step"] == s] for s in steps]
    on_link = np.array([sum(link.seconds(float(b), tel.world_size) for b in sent) if link
                        else 0.0 for sent in sizes])
    step_s = np.asarray(spans["end"] - spans["start"], dtype=float)
    return {"steps": len(steps), "allreduces": float(np.mean([len(b) for b in sizes])),
            "mb": float(np.mean([b.sum() for b in sizes])) / MB,
            "seconds": float(np.median(step_s)), "link_seconds": float(np.median(on_link)),
            "rest_seconds": float(np.median(step_s - on_link))}


def _split_bar(ax: Any, y: float, link_ms: float, rest_ms: float, low: float, high: float,
               style: dict[str, Any]) -> None:
    """One horizontal bar: the link's part (hatched, exact), then the rest (measured) with a
    whisker from its lowest to its highest run."""
    from course_lib.plots.style import BLACK

    ax.barh(y, link_ms, 0.6, color=style["color"], hatch="//", edgecolor=BLACK, lw=0.5)
    ax.barh(y, rest_ms, 0.6, left=link_ms, color="white", edgecolor=style["color"], lw=1.5)
    if high > low:
        ax.errorbar(link_ms + rest_ms, y, xerr=[[rest_ms - low], [high - rest_ms]],
                    fmt="none", ecolor=BLACK, capsize=4, lw=1.2)
    ax.text(link_ms + high, y, f" link {link_ms:.1f} + rest {rest_ms:.1f} ms"
            f" ({low:.1f}-{high:.1f})", va="center", fontsize="small")


def plot_link_and_rest(runs: dict[str, list[dict[str, float]]], title: str):
    """One bar per setting from its repeated runs' sync_cost: the link's milliseconds per step
    (hatched: the simulator's exact wait, the same in every run) and the rest of the step
    (measured: the median of the runs, a whisker from the lowest to the highest)."""
    from course_lib.plots.charts import bar_style
    from course_lib.plots.style import new_figure

    fig = new_figure(8, 1.3 + 0.6 * len(runs))
    ax = fig.subplots()
    for i, costs in enumerate(runs.values()):
        rest = [c["rest_seconds"] * 1e3 for c in costs]
        link_ms = float(np.median([c["link_seconds"] for c in costs])) * 1e3
        _split_bar(ax, -i, link_ms, float(np.median(rest)), min(rest), max(rest), bar_style(i))
    ax.set_yticks(-np.arange(len(runs)), list(runs))
    ax.set_xlabel("ms per optimizer step: on the link (hatched, exact) + the rest (measured)")
    ax.margins(x=0.45)
    sizes = {len(costs) for costs in runs.values()}
    count = sizes.pop() if len(sizes) == 1 else "several"
    ax.set_title(f"{title}\nrest: median of {count} runs, whisker from the lowest to the "
                 "highest", fontsize="medium")
    return fig


def plot_sync_cost(costs: dict[str, dict[str, float]], title: str = ""):
    """Three panels, one bar per run: all-reduces, MB, and milliseconds per optimizer step,
    the last with the link's part (crossed, exact) drawn over the measured step."""
    from course_lib.plots import charts
    from course_lib.plots.style import BLACK, new_figure

    fig = new_figure(8.4, 3.0)
    panels = (("allreduces", "all-reduces per optimizer step", "{:.0f}", 1),
              ("mb", "MB all-reduced per optimizer step", "{:.2f}", 1),
              ("seconds", "ms per optimizer step\n(crossed: on the link, exact)", "{:.1f}", 1e3))
    for ax, (key, title, fmt, scale) in zip(fig.subplots(1, 3), panels):
        charts.bars({name: cost[key] * scale for name, cost in costs.items()}, ylabel="",
                    title=title, fmt=fmt, ax=ax)
    ax = fig.axes[2]
    for i, cost in enumerate(costs.values()):  # the link's part of each bar, drawn over it
        ax.bar(i, cost["link_seconds"] * 1e3, 0.8, fill=False, hatch="xx", edgecolor=BLACK,
               lw=0.5)
    if title:
        fig.suptitle(title)
    return fig


def plot_rank_gap(gaps: dict[str, list[float]]):
    """Per run, the distance between two ranks' weights after each optimizer step."""
    from course_lib.plots import charts

    fig = charts.lines(gaps, ylabel="‖rank 0 weights − rank 1 weights‖",
                       title="How far apart the ranks' weights are (0: identical)",
                       xlabel="optimizer step", markersize=6, first_step=1)
    fig.axes[0].set_ylim(0, None)
    return fig


def plot_allreduces_per_step(tel: Any, title: str):
    """Per optimizer step and rank, the all-reduces DDP made (one bar each, with its MB)."""
    from course_lib.plots.style import new_figure, rank_bar_style, step_axis

    fig = new_figure(7, 3.0)
    ax = fig.subplots()
    steps = sorted({int(s) for s in tel.spans.where(name="step")["step"]})
    width = 0.8 / len(tel.ranks)
    for i, rank in enumerate(tel.ranks):
        comms = tel.comms.where(rank=rank)
        calls = [int((comms["step"] == s).sum()) for s in steps]
        sent = [float(comms["bytes"][comms["step"] == s].sum()) / MB for s in steps]
        bars = ax.bar([s + (i - (len(tel.ranks) - 1) / 2) * width for s in steps], calls,
                      width, label=f"rank {rank}", **rank_bar_style(rank))
        ax.bar_label(bars, [f"{c} ({m:.1f} MB)" for c, m in zip(calls, sent)],
                     fontsize="small")
    ax.set_ylim(0, max(1, ax.get_ylim()[1]) * 1.25)
    step_axis(ax)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("all-reduces")
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small", loc="upper right")
    return fig


def plot_loss_curves(curves: dict[str, list[float]], k: int):
    """Training loss per optimizer step, one line per run."""
    from course_lib.plots import charts

    return charts.lines(curves, ylabel="loss on the global batch", log=True, nested=True,
                        markersize=6, title=f"Accumulating k = {k} micro-batches with SGD")


def plot_reference_gap(gaps: dict[str, float], tolerance: float):
    """One bar per run: the largest difference between its gradient and one process's on the
    global batch (log scale), with the tolerance drawn as a line."""
    from course_lib.plots.charts import bar_style
    from course_lib.plots.style import HIGHLIGHT, new_figure

    fig = new_figure(6, 3.0)
    ax = fig.subplots()
    floor = tolerance / 100  # a gap of 0 drawn at the floor, labelled with its true value
    values = [max(v, floor) for v in gaps.values()]
    bars = ax.bar(range(len(gaps)), values)
    for i, bar in enumerate(bars):
        bar.set(**bar_style(i))
    ax.bar_label(bars, [f"{v:.1e}" for v in gaps.values()], fontsize="small")
    ax.axhline(tolerance, color=HIGHLIGHT, ls="--", lw=1)
    ax.text(-0.4, tolerance * 1.5, f"tolerance {tolerance:g}", color=HIGHLIGHT,
            fontsize="small")
    ax.set_yscale("log")
    ax.set_ylim(floor / 3, max(values) * 20)
    ax.set_xticks(range(len(gaps)), list(gaps))
    ax.set_ylabel("largest |gradient - one process|")
    ax.set_title("Accumulated gradient against one process on the global batch",
                 fontsize="medium")
    return fig


# -- the grid behind the widget: {(mode, k, gbit_per_s): sync_cost} --------------------------

def _grid_axes(grid: dict[tuple[str, int, float], dict[str, float]]):
    modes = sorted({m for m, _, _ in grid})
    ks = sorted({k for _, k, _ in grid})
    links = sorted({g for _, _, g in grid})
    return modes, ks, links


def plot_accumulation_grid(grid: dict[tuple[str, int, float], dict[str, float]]):
    """Two panels against k, one line per (mode, bandwidth), a colour per bandwidth and a
    line style and marker per mode: left, the link's milliseconds per optimizer step (the
    simulator's exact wait for the all-reduces each run made); right, the whole step as
    measured, noise included."""
    from course_lib.plots.charts import series_style
    from course_lib.plots.style import new_figure

    modes, ks, links = _grid_axes(grid)
    fig = new_figure(10, 3.8)
    panels = (("link_seconds", "on the link alone (exact)"),
              ("seconds", "the whole step (measured, one run each)"))
    for ax, (key, title) in zip(fig.subplots(1, 2, sharey=True), panels):
        for i, gbit in enumerate(links):
            for j, mode in enumerate(modes):
                ms = [grid[mode, k, gbit][key] * 1e3 for k in ks]
                look = {**series_style(j), "color": series_style(i)["color"]}  # colour: link
                ax.plot(ks, ms, label=f"{mode}, {gbit:g} Gbit/s", **look)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k, micro-batches per optimizer step")
        ax.set_title(title, fontsize="medium")
    fig.axes[0].set_ylabel("ms per optimizer step")
    fig.axes[0].legend(fontsize="small")
    fig.suptitle("Time per optimizer step on a simulated link (real runs)")
    return fig


def plot_grid_point(grid: dict[tuple[str, int, float], dict[str, float]], k: int,
                    gbit: float):
    """One (k, bandwidth) point of the grid: each mode's all-reduces and ms per step."""
    modes, ks, links = _grid_axes(grid)
    if (modes[0], k, gbit) not in grid:
        raise ValueError(f"no run with k={k} at {gbit} Gbit/s; the grid has k in {ks} and "
                         f"bandwidths {links}")
    costs = {mode: grid[mode, k, gbit] for mode in modes}
    return plot_sync_cost(costs, f"k = {k} micro-batches, link {gbit:g} Gbit/s")


def accumulation_explorer(grid: dict[tuple[str, int, float], dict[str, float]]):
    """plot_accumulation_grid(grid), then sliders for k and bandwidth that redraw one point
    from the cached runs (moving them runs nothing)."""
    import ipywidgets as widgets
    from IPython.display import display

    from course_lib.plots.explore import redrawn_below

    modes, ks, links = _grid_axes(grid)
    display(plot_accumulation_grid(grid))
    k_slider = widgets.SelectionSlider(options=ks, value=ks[len(ks) // 2], description="k")
    link_slider = widgets.SelectionSlider(options=links, value=links[0],
                                          description="Gbit/s")

    def draw():
        return plot_grid_point(grid, k_slider.value, link_slider.value)

    display(draw())
    out = redrawn_below(draw, k_slider, link_slider)
    return widgets.VBox([widgets.HBox([k_slider, link_slider]), out])
