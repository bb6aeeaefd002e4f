"""Pictures of lesson 08's scaling model and of runs on the simulated link: efficiency
against world size, step time against bucket size, one bar or one loss curve per run, and
an explorer. Never imported by the ranks, so the plotting stack is imported at the top.
"""

from __future__ import annotations

import statistics
from typing import Any

from course_lib.plots import charts
from course_lib.plots.style import HIGHLIGHT, RANK_COLORS, new_figure
from course_lib.teach.scaling_model import (
    MB,
    ONE_NODE,
    PRESETS,
    Link,
    crossover,
    efficiency,
    predict_step,
)


def plot_scaling(models: dict[str, tuple[float, int]], links: dict[str, Link],
                 measured: dict[int, tuple[float, float, float]] | None = None,
                 sizes: tuple[int, ...] = (2, 4, 8, 16, 32, 64), title: str = ""):
    """Predicted weak-scaling efficiency against world size, one panel per model of `models`
    {name: (compute seconds, gradient bytes)}, one line per link (a link of ONE_NODE stops
    at its node's size), each line's crossover (communication = compute) starred. `measured`
    {world size: (one rank's step, step on the simulated link, predicted step)} from real
    ranks is drawn on the first panel."""
    fig = new_figure(8.4, 6.2)
    axes = fig.subplots(1, len(models), sharey=True)
    top = 1.05
    for ax, (model, (compute_s, nbytes)) in zip(axes, models.items()):
        for i, (name, link) in enumerate(links.items()):
            most = ONE_NODE.get(name, sizes[-1])
            _scaling_line(ax, compute_s, nbytes, name, link,
                          tuple(n for n in sizes if n <= most), charts.series_style(i))
        if measured and ax is axes[0]:
            top = max(1.05, *(0.05 + efficiency(m[0], m[1]) for m in measured.values()))
            _measured_points(ax, measured, HIGHLIGHT)
        ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.text(sizes[-1], 0.52, "communication\n= compute", ha="right", fontsize="small")
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, *sizes], [str(n) for n in (1, *sizes)])
        ax.minorticks_off()
        ax.set_ylim(0, top)
        ax.set_xlabel("world size (ranks)")
        ax.set_title(f"{model}: {nbytes / MB:.1f} MB of gradients,\n"
                     f"{compute_s * 1e3:.1f} ms compute a step (this CPU)", fontsize="small")
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1)
    axes[0].set_ylabel("efficiency = one rank's step / step")
    fig.suptitle(title or "Predicted weak-scaling efficiency with this CPU's compute (star: "
                 "communication starts to dominate;\na GPU's shorter compute moves every star "
                 "to the left)", fontsize="medium")
    return fig


def _scaling_line(ax: Any, compute_s: float, nbytes: int, name: str, link: Link,
                  sizes: tuple[int, ...], style: dict[str, Any]) -> None:
    """One link's predicted efficiency at `sizes`, its crossover starred in its colour."""
    eff = [efficiency(compute_s, predict_step(compute_s, nbytes, n, link)) for n in sizes]
    at = crossover(compute_s, nbytes, link, sizes[-1])
    where = f"never dominates up to {sizes[-1]}" if at is None else f"dominates from {at}"
    ax.plot(sizes, eff, ms=4, label=f"{name} ({where})", **style)
    if at is not None:
        at_eff = efficiency(compute_s, predict_step(compute_s, nbytes, at, link))
        ax.plot([at], [at_eff], marker="*", ms=15, color=style["color"], mec="black",
                zorder=5)


def _measured_points(ax: Any, measured: dict[int, tuple[float, float, float]],
                     color: str) -> None:
    ns = sorted(measured)
    ax.plot(ns, [efficiency(measured[n][0], measured[n][1]) for n in ns], "o", ms=10,
            color=color, fillstyle="none", mew=2,
            label="real ranks here on SIMULATED 1 GbE")
    ax.plot(ns, [efficiency(measured[n][0], measured[n][2]) for n in ns], "x--", ms=8,
            lw=0.8, color="black", label="predicted for those runs")


def plot_bucket_sweep(sweep: dict[float, dict[str, Any]], link: Link, loopback_ms: float):
    """Step time against bucket_cap_mb: `sweep` {cap: {"ms": [step ms per repeat],
    "buckets": all-reduces a step}}, each repeat (one pass over the sizes) a thin line, the
    median bold, the mechanism that costs time at each end labelled, and the step without
    the link for reference."""
    caps = sorted(sweep)
    fig = new_figure(8, 3.8)
    ax = fig.subplots()
    for r in range(len(sweep[caps[0]]["ms"])):
        ax.plot(caps, [sweep[c]["ms"][r] for c in caps], color="grey", lw=0.8, alpha=0.6,
                marker=".", label="each repeat (one pass over the sizes)" if r == 0 else None)
    mid = [statistics.median(sweep[c]["ms"]) for c in caps]
    ax.plot(caps, mid, marker="o", lw=2.2, color=RANK_COLORS[0],
            label=f"median, on simulated {link.label()}")
    for cap, m in zip(caps, mid):
        n = sweep[cap]["buckets"]
        last = cap == caps[-1]
        ax.annotate(f"{n:g} bucket{'' if n == 1 else 's'}", (cap, m), textcoords="offset points",
                    xytext=(-6 if last else 6, -14), ha="right" if last else "left",
                    fontsize="small")
    ax.axhline(loopback_ms, color="black", ls=":", lw=1, label="same step without the link")
    top = max(max(sweep[c]["ms"]) for c in caps)
    ax.text(caps[0], top * 1.17, "many buckets:\neach pays 2(N-1) latencies", ha="left",
            va="top", fontsize="small", color=HIGHLIGHT)
    ax.text(caps[-1], top * 1.17, "one bucket: the link starts\nonly when backward ends",
            ha="right", va="top", fontsize="small", color=HIGHLIGHT)
    ax.set_xscale("log")
    ax.set_xticks(caps, [f"{c:g}" for c in caps])
    ax.minorticks_off()
    ax.set_ylim(0, top * 1.2)
    ax.set_xlabel("bucket_cap_mb")
    ax.set_ylabel("ms per step")
    ax.set_title("Bucket size on a slow, high-latency link: latency x buckets against overlap",
                 fontsize="medium")
    ax.legend(fontsize="small", loc="lower center")
    return fig


def plot_bars(values: dict[str, float], ylabel: str, title: str, fmt: str = "{:.1f}"):
    """One bar per run (a bucket size, a hook), labelled with its value."""
    return charts.bars(values, ylabel=ylabel, title=title, fmt=fmt)


def plot_losses(curves: dict[str, list[float]], title: str):
    """Training loss per step, one line per run (hollow markers: the runs may coincide)."""
    return charts.lines(curves, ylabel="training loss (rank 0)", title=title, nested=True)


def scaling_explorer(seconds_per_param: float, sizes_m: tuple[float, ...] = (1, 10, 100, 1000)):
    """Sliders: world size, model size (millions of fp32 parameters), link -> predicted step
    time and efficiency, compute calibrated at `seconds_per_param` (measured here)."""
    import ipywidgets as widgets

    world = widgets.SelectionSlider(options=[2, 4, 8, 16, 32, 64], value=8,
                                    description="world size")
    params = widgets.SelectionSlider(options=list(sizes_m), value=sizes_m[1],
                                     description="M params")
    link = widgets.Dropdown(options=list(PRESETS), value="10 GbE", description="link")
    out = widgets.HTML()

    def redraw(_: object = None) -> None:
        n_params = params.value * 1e6
        compute = seconds_per_param * n_params
        step = predict_step(compute, int(4 * n_params), world.value, PRESETS[link.value])
        out.value = (f"compute {compute * 1e3:.1f} ms + all-reduce "
                     f"{(step - compute) * 1e3:.1f} ms = <b>{step * 1e3:.1f} ms</b> a step; "
                     f"efficiency <b>{efficiency(compute, step):.0%}</b>")

    for w in (world, params, link):
        w.observe(redraw, "value")
    redraw()
    return widgets.VBox([widgets.HBox([world, params, link]), out])
