"""The desync report as a picture: one lane per rank, each collective a box at its sequence
number, the first point where the ranks differ highlighted.

    try:
        launch(train, 3)
    except DistributedError as err:
        plot_desync(err)          # or err.desync, the launching.desync_report.DesyncReport
"""

from __future__ import annotations

from typing import Any

from course_lib.launching.desync_report import DesyncReport

SHOWN = 6  # collectives drawn, at most: the last ones up to the first difference


def report_of(source: Any) -> DesyncReport:
    """The DesyncReport of a DistributedError (or the report itself); a clear error when
    the launch had none."""
    report = getattr(source, "desync", source)
    if not isinstance(report, DesyncReport):
        raise ValueError(
            "no desync report here: pass the DistributedError that launch() raised (its "
            ".desync is None when the launch ran with desync_report=False)")
    return report


def plot_desync(source: Any, title: str = ""):
    """Draw the ranks' collectives side by side: a box per collective (its op and shape),
    a thick black outline where the rank was when it ended, an empty dashed box where it
    issued nothing, and the first difference shaded in the highlight colour (no box face
    uses a colour near it)."""
    from matplotlib.patches import FancyBboxPatch, Rectangle

    from course_lib.plots.style import BLACK, HIGHLIGHT, new_figure

    report = report_of(source)
    seqs = _shown(report)
    ranks = len(report.traces)
    fig = new_figure(max(6.5, 1.05 * len(seqs) + 2.0), 0.85 * ranks + 1.5)
    ax = fig.subplots()
    diff = report.first_difference
    if diff in seqs:
        x = seqs.index(diff)
        ax.add_patch(Rectangle((x - 0.5, -0.6), 1, ranks + 0.2, color=HIGHLIGHT, alpha=0.15,
                               zorder=0))
    colours = _colours(report, seqs)
    for lane, trace in enumerate(report.traces):
        y = ranks - 1 - lane
        for x, seq in enumerate(seqs):
            call = trace.at(seq) if trace.dumped else None
            blocked = call is not None and trace.inside and seq == trace.last
            face = colours.get(call.label, "white") if call else "white"
            ax.add_patch(FancyBboxPatch(
                (x - 0.44, y - 0.34), 0.88, 0.68, boxstyle="round,pad=0.02",
                facecolor=face, alpha=1 if call else 0, edgecolor=BLACK,
                linewidth=3 if blocked else 0.8, linestyle="-" if call else "--"))
            text = f"{call.label.replace(' ', chr(10), 1)}\n{_source(call.where)}" if call else (
                "no dump" if not trace.dumped else "not issued")
            ax.text(x, y, text, ha="center", va="center", fontsize="small",
                    color=BLACK if call else "grey")
        ax.text(len(seqs) - 0.4, y, trace.ended, va="center", fontsize="small")
    ax.set_xlim(-0.6, len(seqs) + 1.4)
    ax.set_ylim(-0.7, ranks - 0.3)
    ax.set_xticks(range(len(seqs)), [f"#{s}" for s in seqs])
    ax.set_yticks(range(ranks), [f"rank {t.rank}" for t in reversed(report.traces)])
    ax.set_xlabel("collective number (the same count on every rank); right: how the rank ended")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title(title or _title(report), fontsize="medium", loc="left")
    return fig


def _source(where: str) -> str:
    """A short tag for a box: what DDP was doing, or the learner's line."""
    if "(" in where:
        return where[where.index("(") + 1:-1].replace("DDP's ", "DDP ")
    return where.rsplit(", ", 1)[-1]


def _shown(report: DesyncReport) -> list[int]:
    """The sequence numbers to draw: up to SHOWN, ending at the last collective issued."""
    end = max((t.last for t in report.traces), default=0)
    diff = report.first_difference
    last = end if diff is None else min(end, diff + 1)
    return list(range(max(1, last - SHOWN + 1), last + 1))


def _colours(report: DesyncReport, seqs: list[int]) -> dict[str, str]:
    """One colour per distinct collective (op and shape), the same on every lane."""
    from course_lib.plots.style import BLUE, GREEN, PURPLE, SKY, YELLOW

    palette = (SKY, YELLOW, GREEN, PURPLE, BLUE)  # not orange: the shading is vermilion
    labels = []
    for seq in seqs:
        for trace in report.traces:
            call = trace.at(seq)
            if call and call.label not in labels:
                labels.append(call.label)
    return {label: palette[i % len(palette)] for i, label in enumerate(labels)}


def _title(report: DesyncReport) -> str:
    diff = report.first_difference
    if diff is None and (report.missing or report.mismatch):
        ranks = ", ".join(str(r) for r in sorted({*report.missing, *report.mismatch}))
        return (f"The logs do not part, but rank(s) {ranks} left no log or hit gloo's size "
                "check: not shown free of a desync")
    if diff is None:
        return "The ranks issued the same collectives: no desync"
    return (f"The ranks part at collective #{diff} (shaded).\nThick black outline: the "
            "collective a rank was in when it ended.")
