"""A Gantt chart per rank: compute spans, each all-reduce bucket, and idle time."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from course_lib.plots.style import (
    BLACK,
    BLUE,
    GREEN,
    ORANGE,
    PURPLE,
    SKY,
    YELLOW,
    new_figure,
    require,
)
from course_lib.telemetry import Table, Telemetry

# name -> (colour, hatch); distinct in greyscale through brightness and hatching
KNOWN = {"forward": (SKY, ""), "backward": (BLUE, ""), "optimizer": (GREEN, "\\\\"),
         "allreduce": (ORANGE, "//"), "data": (YELLOW, "xx"), "idle": ("#DDDDDD", "..")}
OTHERS = ((PURPLE, "++"), ("#999999", "oo"), ("#FFFFFF", "\\\\"))
LANE_HEIGHT = 0.8
# A bucket's label is drawn only on a bar at least this share of the time axis wide, so that
# labels in "small" type never run into each other (the figure is drawn 8.4 inches wide, about
# JupyterLab's 848-pixel output width, so the type is shown at its full size).
LABEL_SHARE = 1 / 22


def timeline(tel: Telemetry, steps: Iterable[int] | None = None,
             ranks: Iterable[int] | None = None) -> Figure:
    """Per rank, a compute lane (spans, idle gaps) and a communication lane (collectives);
    only the given steps and ranks when they are given."""
    require(len(tel.spans) + len(tel.comms), "spans or all-reduces",
            "use rec.span(...), rec.step(...) or rec.watch_ddp(model)")
    spans, comms = tel.spans, tel.comms
    if steps is not None:
        keep = list(steps)
        spans, comms = _only(spans, keep), _only(comms, keep)
    shown = list(tel.ranks if ranks is None else ranks)
    if not shown:
        raise ValueError("no rank to draw: switch at least one rank on")
    t0 = min(np.min(t["start"], initial=np.inf) for t in (spans, comms))
    t1 = max(np.max(t["end"], initial=-np.inf) for t in (spans, comms))
    styles = _styles(spans, comms)
    fig = new_figure(8.4, 1.9 + 1.1 * len(shown))
    ax = fig.subplots()
    labels = []
    for i, rank in enumerate(shown):
        compute_y, comm_y = -2 * i, -2 * i - 1
        _compute_lane(ax, spans.where(rank=rank), compute_y, t0, styles)
        _comm_lane(ax, comms.where(rank=rank), comm_y, t0, styles, (t1 - t0) * LABEL_SHARE)
        labels += [(compute_y, f"rank {rank} compute"), (comm_y, f"rank {rank} communication")]
    ax.set_yticks(*zip(*labels))
    ax.set_xlabel("milliseconds since the first recorded event")
    ax.grid(axis="x", alpha=0.3)
    fig.legend(handles=[Patch(facecolor=c, hatch=h, edgecolor=BLACK, label=n)
                       for n, (c, h) in styles.items()], loc="outside lower center",
               ncol=4, fontsize="small")
    fig.suptitle("Timeline per rank: what each rank did, and when\n"
                 "Do the all-reduces run during backward? Light grey, small dots = idle (no span)",
                 fontsize="medium")
    return fig


def _only(table: Table, steps: list[int]) -> Table:
    return Table({c: table[c][np.isin(table["step"], steps)] for c in table.columns})


def _styles(spans: Table, comms: Table) -> dict[str, tuple[str, str]]:
    names = [n for n in dict.fromkeys(spans["name"].tolist()) if n != "step"]
    names += [n for n in dict.fromkeys(comms["op"].tolist())]
    others = iter(OTHERS * len(names))
    styles = {n: KNOWN.get(n) or next(others) for n in names}
    if len(spans):
        styles["idle"] = KNOWN["idle"]
    return styles


def _bars(ax, y: float, intervals: list[tuple[float, float]], t0: float, style: tuple,
          texts: list[str] | None = None, height: float = LANE_HEIGHT) -> None:
    if not intervals:
        return
    starts, ends = (np.array(v) for v in zip(*intervals))
    color, hatch = style
    bars = ax.barh(y, (ends - starts) * 1e3, left=(starts - t0) * 1e3, height=height,
                   color=color, hatch=hatch, edgecolor=BLACK, linewidth=0.5)
    if texts:
        ax.bar_label(bars, texts, label_type="center", fontsize="small")


def _compute_lane(ax, spans: Table, y: float, t0: float, styles: dict) -> None:
    for name in styles:
        rows = spans.where(name=name)
        _bars(ax, y, list(zip(rows["start"], rows["end"])), t0, styles[name])
    steps = spans.where(name="step")
    busy = [(s, e) for n, s, e in zip(spans["name"], spans["start"], spans["end"]) if n != "step"]
    windows = list(zip(steps["start"], steps["end"])) or _extent(busy)
    if "idle" in styles:
        _bars(ax, y, _gaps(windows, busy), t0, styles["idle"])


def _comm_lane(ax, comms: Table, y: float, t0: float, styles: dict, min_label: float) -> None:
    """Collectives, each DDP bucket in its own row of the lane (buckets in flight together
    do not hide each other), labelled b<index> where its bar is wide enough."""
    rows_of = sorted({int(b) for b in comms["bucket"]}) or [-1]
    height = LANE_HEIGHT / len(rows_of)
    for op in comms.unique("op"):
        for row, bucket in enumerate(rows_of):
            rows = comms.where(op=op, bucket=bucket)
            wide = (rows["end"] - rows["start"]) >= min_label
            texts = [f"b{b}" if b >= 0 and w else "" for b, w in zip(rows["bucket"], wide)]
            middle = y + LANE_HEIGHT / 2 - (row + 0.5) * height
            _bars(ax, middle, list(zip(rows["start"], rows["end"])), t0, styles[op], texts,
                  height)


def _extent(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(min(s for s, _ in intervals), max(e for _, e in intervals))] if intervals else []


def _gaps(windows: list[tuple[float, float]],
          busy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Parts of the windows that no busy interval covers."""
    gaps = []
    for w_start, w_end in windows:
        cursor = w_start
        for start, end in sorted(busy):
            if end <= cursor or start >= w_end:
                continue
            if start > cursor:
                gaps.append((cursor, start))
            cursor = max(cursor, end)
        if cursor < w_end:
            gaps.append((cursor, w_end))
    return gaps
