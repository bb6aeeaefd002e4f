"""Where a step's time goes, per rank, from a run's telemetry: compute, data loading, time
inside the all-reduces split into waiting for the last rank and communicating, the all-reduce
time that ran while backward was still computing, and the step time.

    time_breakdown(run.telemetry)   # {rank: {"compute": s, "data": s, "communication": s,
                                    #         "wait": s}}
    plot_breakdown({"label": run.telemetry, ...})
    overlap(run.telemetry)          # {rank: (s per step of all-reduce during backward, after)}
    step_time(run.telemetry)        # mean seconds per step, slowest rank
    plot_repeats({"setting": [ms, ms, ms], ...}, xlabel, title)   # repeated runs, whiskers

Steps are averaged (a mean, the wall clock over the steps), not a median: a job that stalls
every few steps for its data is as slow as its mean, and a median hides the stalls. The
breakdown's parts are means too, so parts and step use the same statistic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

COMPUTE = ("forward", "backward", "optimizer")  # spans in which a rank computes
DATA = "data"  # the span in which a rank waits for its next batch
CATEGORIES = ("compute", "data", "communication", "wait")
# The breakdown's "wait" is not the timeline's "wait for all-reduce" span (the rest of
# loss.backward()): it is time inside an all-reduce before the last rank called it.
LEGEND = {"wait": "waiting for the last rank"}


def time_breakdown(tel: Any, skip: int = 0) -> dict[int, dict[str, float]]:
    """Seconds per rank over the steps from `skip` on: compute (forward, backward, optimizer
    spans), data (data spans), and the time inside collectives, split at the moment the last
    rank called each one: before it the rank waits for the others ("wait"), after it the data
    moves ("communication"). Collectives in flight together count once (a union of intervals)."""
    spans = tel.spans
    out = {}
    for rank in tel.ranks:
        mine = spans.where(rank=rank)
        kept = mine["step"] >= skip
        length = (mine["end"] - mine["start"])[kept]
        names = mine["name"][kept]
        out[rank] = {"compute": float(length[np.isin(names, COMPUTE)].sum()),
                     "data": float(length[names == DATA].sum()), "communication": 0.0,
                     "wait": 0.0}
    inside: dict[int, list] = {r: [] for r in tel.ranks}
    waiting: dict[int, list] = {r: [] for r in tel.ranks}
    for (step, _bucket), rows in collectives(tel.comms).items():
        if step < skip:
            continue
        last = max(start for _, start, _ in rows)  # the moment the last rank called it
        for rank, start, end in rows:
            inside[rank].append((start, end))
            waiting[rank].append((start, min(last, end)))
    for rank in tel.ranks:
        wait = covered(waiting[rank])
        out[rank]["wait"] = wait
        out[rank]["communication"] = covered(inside[rank]) - wait
    return out


def covered(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one of the (start, end) intervals (overlaps count once)."""
    total, reach = 0.0, -np.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def collectives(comms: Any) -> dict[tuple[int, int], list[tuple[int, float, float]]]:
    """Each collective, named by (step, bucket), with every rank's (rank, start, end)."""
    found: dict[tuple[int, int], list[tuple[int, float, float]]] = {}
    for rank, step, bucket, start, end in zip(comms["rank"], comms["step"], comms["bucket"],
                                              comms["start"], comms["end"]):
        found.setdefault((int(step), int(bucket)), []).append(
            (int(rank), float(start), float(end)))
    return found


def step_times(tel: Any, skip: int = 2) -> dict[int, float]:
    """Mean seconds per step on each rank, leaving out the first `skip` steps (warm-up):
    throughput, stalls included."""
    out = {}
    for rank in tel.ranks:
        steps = tel.spans.where(rank=rank, name="step")
        keep = steps["step"] >= skip
        if not keep.any():
            raise ValueError(f"rank {rank} recorded no step after the first {skip}: record "
                             "more steps with rec.step(step)")
        out[rank] = float(np.mean((steps["end"] - steps["start"])[keep]))
    return out


def step_time(tel: Any, skip: int = 2) -> float:
    """The job's step time: the slowest rank's mean (the ranks wait for it)."""
    return max(step_times(tel, skip).values())


def overlap(tel: Any, skip: int = 2) -> dict[int, tuple[float, float]]:
    """Per rank, seconds per step (mean over the steps from `skip`) during which an all-reduce
    was in flight while backward still computed, and during which one was in flight after."""
    out = {}
    for rank in tel.ranks:
        spans, comms = tel.spans.where(rank=rank, name="backward"), tel.comms.where(rank=rank)
        during = after = 0.0
        steps = [(st, s, e) for st, s, e in zip(spans["step"], spans["start"], spans["end"])
                 if st >= skip]
        for step, start, end in steps:
            mine = comms.where(step=step)
            flight = list(zip(mine["start"], mine["end"]))
            inside = covered([(max(s, start), min(e, end)) for s, e in flight if e > start
                              and s < end])
            during += inside
            after += covered(flight) - inside
        n = max(1, len(steps))
        out[rank] = (during / n, after / n)
    return out


def per_step(tel: Any, skip: int = 2) -> dict[int, dict[str, float]]:
    """time_breakdown(tel, skip) in milliseconds per step, leaving out warm-up steps."""
    out = {}
    for rank, seconds in time_breakdown(tel, skip).items():
        recorded = tel.spans.where(rank=rank, name="step")["step"]
        steps = max(1, int((recorded >= skip).sum()))
        out[rank] = {k: v / steps * 1e3 for k, v in seconds.items()}
    return out


def plot_breakdown(runs: dict[str, Any], skip: int = 2):
    """For each run, per rank: milliseconds per step of compute, data loading, communication
    and waiting for the other ranks, next to the step time (the slowest rank's mean), over
    the steps from `skip` (the first ones warm up). Shares can add up to more than 100%:
    communication runs while backward still computes."""
    from course_lib.plots.style import BLUE, HIGHLIGHT, ORANGE, YELLOW, new_figure

    styles = {"compute": (BLUE, ""), "data": (YELLOW, "xx"), "communication": (ORANGE, "//"),
              "wait": (HIGHLIGHT, "--")}  # not the timeline's idle dots
    fig = new_figure(4.2 * len(runs), 1.3 + 1.0 * max(len(t.ranks) for t in runs.values()))
    axes = np.atleast_1d(fig.subplots(1, len(runs), sharex=True))
    for ax, (label, tel) in zip(axes, runs.items()):
        _breakdown_axes(ax, per_step(tel, skip), step_time(tel, skip) * 1e3, styles)
        ax.set_title(label, fontsize="medium")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=4,
               fontsize="small")
    fig.suptitle("Where each rank's time goes, mean ms per step\n(shares can add up to more "
                 "than 100%: communication overlaps backward)", fontsize="medium")
    return fig


def _breakdown_axes(ax: Any, ms: dict[int, dict[str, float]], step_ms: float,
                    styles: dict[str, tuple[str, str]]) -> None:
    from course_lib.plots.style import BLACK

    height = 0.8 / len(CATEGORIES)
    for i, rank in enumerate(ms):
        for j, name in enumerate(CATEGORIES):
            color, hatch = styles[name]
            y = -i + 0.4 - (j + 0.5) * height  # compute on top, wait at the bottom
            bar = ax.barh(y, ms[rank][name], height, color=color, hatch=hatch,
                          edgecolor=BLACK, linewidth=0.5,
                          label=LEGEND.get(name, name) if i == 0 else None)
            share = ms[rank][name] / step_ms
            ax.bar_label(bar, [f"{ms[rank][name]:.0f} ms ({share:.0%})"], fontsize="small",
                         padding=2)
    ax.axvline(step_ms, color=BLACK, ls=":", lw=1)
    ax.text(step_ms, 0.55, f" step {step_ms:.0f} ms", fontsize="small")
    ax.set_yticks([-i for i in range(len(ms))], [f"rank {r}" for r in ms])
    ax.set_ylim(-len(ms) + 0.45, 0.75)
    ax.set_xlabel("ms per step (share of the step)")
    ax.margins(x=0.6)


def plot_step_times(times: dict[str, Sequence[float]], title: str):
    """One bar per setting from its repeated runs' step times in seconds (plot_repeats),
    each labelled with its speed-up over the first setting (ratio of the medians)."""
    return plot_repeats({name: [s * 1e3 for s in runs] for name, runs in times.items()},
                        "mean step time, slowest rank (ms); after the comma: the median's "
                        "speed-up over the first", title, speedup=True, fmt="{:.0f}")


def plot_repeats(samples: dict[str, Sequence[float]], xlabel: str, title: str,
                 speedup: bool = False, fmt: str = "{:.1f}"):
    """One horizontal bar per setting at the median of its repeated runs, a whisker from the
    fastest to the slowest run and a dot per run, labelled "median (min-max)": a difference
    between two bars whose whiskers overlap is not a result of this measurement."""
    from course_lib.plots.charts import bar_style
    from course_lib.plots.style import BLACK, new_figure

    for name, runs in samples.items():
        if isinstance(runs, (int, float)) or len(runs) == 0:
            raise ValueError(f"plot_repeats() needs a list of repeated runs per setting; "
                             f"{name!r} has {runs!r}: time each setting several times")
    fig = new_figure(8, 1.2 + 0.5 * len(samples))
    ax = fig.subplots()
    first = float(np.median(next(iter(samples.values()))))
    for i, runs in enumerate(samples.values()):
        values = np.asarray(runs, dtype=float)
        mid, low, high = float(np.median(values)), float(values.min()), float(values.max())
        ax.barh(-i, mid, **bar_style(i), height=0.6)
        ax.errorbar(mid, -i, xerr=[[mid - low], [high - mid]], fmt="none", ecolor=BLACK,
                    capsize=4, lw=1.2)
        ax.plot(values, np.full(len(values), -i), "o", color=BLACK, mec="white", ms=4)
        label = f" {fmt.format(mid)} ({fmt.format(low)}-{fmt.format(high)})"
        ax.text(high, -i, label + (f", {first / mid:.2f}x" if speedup else ""),
                va="center", fontsize="small")
    ax.set_yticks(-np.arange(len(samples)), list(samples))
    ax.set_xlabel(xlabel)
    ax.margins(x=0.3)
    sizes = {len(r) for r in samples.values()}
    count = sizes.pop() if len(sizes) == 1 else "several"
    ax.set_title(f"{title}\nbar: median of {count} runs; whisker: fastest to "
                 "slowest; dots: each run", fontsize="medium")
    return fig
