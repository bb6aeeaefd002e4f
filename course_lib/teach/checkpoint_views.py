"""Lesson 11's pictures: what the other ranks loaded when rank 0 saved without a barrier,
and how far each incomplete checkpoint's resume ends from the uninterrupted run."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch


def outcome(error: BaseException | None, loaded_step: int | None, want_step: int) -> str:
    """One rank's load, in a few words: the error it met, or which checkpoint it got."""
    if error is not None:
        text = str(error).split("\n")[0]
        if "PytorchStreamReader" in text:
            return "partial file (zip error)"
        return f"{type(error).__name__}" + (" (empty file)" if isinstance(error, EOFError) else "")
    return "the new checkpoint" if loaded_step == want_step else "a stale checkpoint"


def plot_outcomes(runs: dict[str, Counter], title: str = "What the other ranks loaded") -> Any:
    """Horizontal bars: for each setting, how many loads ended each way."""
    from course_lib.plots.style import GREEN, VERMILLION, new_figure

    kinds = sorted({k for counts in runs.values() for k in counts},
                   key=lambda k: (k != "the new checkpoint", k))
    # At most 8.2 in: no wider than JupyterLab's notebook (about 850 px), which would shrink it
    fig = new_figure(min(8.2, 5.2 * len(runs)), 1.2 + 0.45 * len(kinds))
    axes = fig.subplots(1, len(runs), sharey=True, squeeze=False)
    for ax, (name, counts) in zip(axes[0], runs.items()):
        values = [counts.get(k, 0) for k in kinds]
        colors = [GREEN if k == "the new checkpoint" else VERMILLION for k in kinds]
        ax.barh(kinds, values, color=colors)
        for y, v in enumerate(values):
            ax.text(v, y, f" {v}", va="center")
        ax.set_title(f"{name}: {sum(values)} loads")
        ax.set_xlabel("loads")
        ax.set_xlim(0, max(1, *values) * 1.2)
    axes[0][0].invert_yaxis()
    fig.suptitle(title)
    return fig


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest |a - b| over every tensor of two state_dicts (0.0: bitwise equal)."""
    return max((a[k].double() - b[k].double()).abs().max().item() for k in b)


def plot_resume_table(rows: dict[str, float], title: str) -> Any:
    """One bar per resumed run: its largest weight difference from the uninterrupted run;
    a run that is bitwise equal gets a mark, not a bar."""
    from course_lib.plots.style import GREEN, VERMILLION, new_figure

    names = list(rows)
    fig = new_figure(8, 0.45 * len(names) + 1.2)
    ax = fig.subplots()
    for y, name in enumerate(names):
        gap = rows[name]
        if gap == 0:
            ax.plot([1e-9], [y], marker="o", color=GREEN)
            ax.text(1.6e-9, y, "bitwise equal", va="center", color=GREEN)
        else:
            ax.barh(y, gap, left=1e-9, color=VERMILLION)
            ax.text(gap * 1.3, y, f"{gap:.1e}", va="center")
    ax.set_xscale("log")
    ax.set_xlim(1e-9, 1)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("largest |weight difference| from the uninterrupted run")
    ax.set_title(title)
    return fig
