"""Lesson 17's pictures of a pipeline, drawn from a real run:

    plot_pipeline(tel, step, title)          # per rank, each micro-batch's forward and backward
    plot_activations(runs, step, peaks)      # micro-batches held over time, and their bytes
    plot_stage_ratios(ratios, ylabel)        # per stage, a gradient against one process's
    plot_p2p_hang(err)                       # the sends and receives each rank began, and the last
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from course_lib.plots.style import (
    BLACK,
    BLUE,
    HIGHLIGHT,
    SKY,
    new_figure,
    rank_bar_style,
    rank_style,
)
from course_lib.teach.pipeline import bubble, chunk_spans, theory_bubble
from course_lib.telemetry import Telemetry

IDLE = "#DDDDDD"
PHASES = {"F": ("forward", SKY, ""), "B": ("backward", BLUE, "//")}


def plot_pipeline(tel: Telemetry, step: int, title: str) -> Figure:
    """Per rank (rank 0 on top), a box per micro-batch's forward (light) and backward (dark,
    hatched), labelled with its number, on grey: the time the rank waited. The title holds
    the bubble measured in this run and the formula's."""
    spans = chunk_spans(tel, step)
    t0, t1 = spans["start"].min(), spans["end"].max()
    fig = new_figure(8.4, 1.2 + 0.55 * len(tel.ranks))
    ax = fig.subplots()
    for rank in tel.ranks:
        y = -rank
        ax.barh(y, (t1 - t0) * 1e3, left=0, height=0.8, color=IDLE, edgecolor=BLACK, lw=0.3)
        rows = spans.where(rank=rank)
        for name, start, end in zip(rows["name"], rows["start"], rows["end"]):
            _, color, hatch = PHASES[name[0]]
            bar = ax.barh(y, (end - start) * 1e3, left=(start - t0) * 1e3, height=0.8,
                          color=color, hatch=hatch, edgecolor=BLACK, lw=0.5)
            ax.bar_label(bar, [name[1:]], label_type="center", fontsize="x-small",
                         color="white" if name[0] == "B" else BLACK)
    m = sum(1 for n in spans.where(rank=tel.ranks[0])["name"] if n[0] == "F")
    p = len(tel.ranks)
    ax.set_yticks([-r for r in tel.ranks], [f"rank {r}\n(stage {r})" for r in tel.ranks])
    ax.set_xlabel("milliseconds since the first forward")
    ax.legend(handles=[Patch(facecolor=c, hatch=h, edgecolor=BLACK, label=f"{n} of micro-batch i")
                       for n, c, h in PHASES.values()]
              + [Patch(facecolor=IDLE, edgecolor=BLACK, label="waiting (the bubble)")],
              loc="upper center", bbox_to_anchor=(0.5, -0.35 - 0.1 / p), ncol=3,
              fontsize="small")
    ax.set_title(f"{title}\nbubble: {bubble(tel, step):.0%} of the ranks' time measured, "
                 f"(p - 1) / (m + p - 1) = {theory_bubble(p, m):.0%} for p = {p}, m = {m}",
                 fontsize="medium")
    return fig


def _held_over_time(tel: Telemetry, step: int, rank: int) -> tuple[list[float], list[int]]:
    spans = chunk_spans(tel, step)
    t0 = spans["start"].min()
    rows = spans.where(rank=rank)
    events = sorted((end, 1 if name[0] == "F" else -1)
                    for name, end in zip(rows["name"], rows["end"]))
    times, held = [0.0], [0]
    for end, change in events:
        times.append((end - t0) * 1e3)
        held.append(held[-1] + change)
    return times, held


def plot_activations(runs: Mapping[str, Telemetry], step: int,
                     peaks: Mapping[str, Sequence[int]]) -> Figure:
    """Left: on stage 0, how many micro-batches' activations are held over the step, one
    line per run. Right: each stage's peak bytes of saved activations (`peaks`, per run a
    list in rank order), measured with saved-tensor hooks."""
    fig = new_figure(8.4, 3.4)
    left, right = fig.subplots(1, 2)
    for i, (name, tel) in enumerate(runs.items()):
        times, held = _held_over_time(tel, step, 0)
        left.step(times, held, where="post", label=name, **{**rank_style(i), "marker": ""})
    left.set_xlabel("milliseconds since the first forward")
    left.set_ylabel("micro-batches held")
    left.set_title("Stage 0: activations kept for backward", fontsize="medium")
    left.legend(fontsize="small")
    width = 0.8 / len(peaks)
    for i, (name, per_stage) in enumerate(peaks.items()):
        at = np.arange(len(per_stage)) + (i - (len(peaks) - 1) / 2) * width
        bars = right.bar(at, [b / 1024 for b in per_stage], width, label=name, **rank_bar_style(i))
        right.bar_label(bars, fmt="%.0f", fontsize="x-small")
    stages = len(next(iter(peaks.values())))
    right.set_xticks(range(stages), [f"stage {s}" for s in range(stages)])
    right.set_ylabel("peak KiB of saved activations")
    right.set_title("Peak activation memory per stage", fontsize="medium")
    right.legend(fontsize="small")
    return fig


def plot_stage_ratios(ratios: Mapping[str, Sequence[float]], ylabel: str, title: str,
                      log: bool = False, reference: float | None = 1.0) -> Figure:
    """One group of bars per stage, a bar per run (`ratios`: run -> a value per stage),
    and a dashed line at `reference` (one process's value)."""
    fig = new_figure(7.5, 3.2)
    ax = fig.subplots()
    width = 0.8 / len(ratios)
    for i, (name, values) in enumerate(ratios.items()):
        at = np.arange(len(values)) + (i - (len(ratios) - 1) / 2) * width
        bars = ax.bar(at, values, width, label=name, **rank_bar_style(i))
        ax.bar_label(bars, fmt="%.2g", fontsize="x-small")
    if reference is not None:
        ax.axhline(reference, color=HIGHLIGHT, ls="--", lw=1, label="one process")
    stages = len(next(iter(ratios.values())))
    ax.set_xticks(range(stages), [f"stage {s}\n(rank {s})" for s in range(stages)])
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def plot_p2p_hang(err: Exception, prefix: str = "p2p ") -> Figure:
    """Per rank, each send or receive it began, in order (the lines it printed starting with
    `prefix`, from the failed launch's DistributedError): the last one, in red, is the one
    it never finished, with how long it had waited when the launch stopped it."""
    run = err.run  # type: ignore[attr-defined]
    lines = [line for line in run.logs if line.text.startswith(prefix)]
    if not lines:
        raise ValueError(f"no line starting with {prefix!r}: print one before each send and "
                         "receive")
    started = [timing["started"] for timing in run.timings if "started" in timing]
    stop = min(started) + run.wall_time if started else max(line.time for line in lines)
    ranks = sorted({line.rank for line in lines})
    slots = max(sum(line.rank == r for line in lines) for r in ranks)
    fig = new_figure(8.4, 1.2 + 0.8 * len(ranks))
    ax = fig.subplots()
    for rank in ranks:
        mine = [line for line in lines if line.rank == rank]
        for i, line in enumerate(mine):
            last = i == len(mine) - 1
            op, what, number, *peer = line.text[len(prefix):].split()
            text = f"{op} {what} {number}\n{' '.join(peer)}"
            if last:
                text += f"\nwaited {stop - line.time:.1f} s"
            color = HIGHLIGHT if last else (SKY if op == "recv" else "#FFFFFF")
            bar = ax.barh(-rank, 0.92, left=i, height=0.8, color=color, edgecolor=BLACK, lw=0.5)
            ax.bar_label(bar, [text], label_type="center", fontsize="x-small",
                         color="white" if last else BLACK)
    ax.set_xlim(-0.05, slots)
    ax.set_xticks([i + 0.46 for i in range(slots)], [f"{i + 1}." for i in range(slots)])
    ax.set_yticks([-r for r in ranks], [f"rank {r}" for r in ranks])
    ax.set_xlabel("the rank's sends and receives, in the order it began them")
    ax.legend(handles=[Patch(facecolor="#FFFFFF", edgecolor=BLACK, label="send, finished"),
                       Patch(facecolor=SKY, edgecolor=BLACK, label="receive, finished"),
                       Patch(facecolor=HIGHLIGHT, edgecolor=BLACK, label="never finished")],
              loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize="small")
    ax.set_title("Where each rank stood when the launch stopped it", fontsize="medium")
    return fig
