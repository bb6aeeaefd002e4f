"""Lesson 05's pictures of BatchNorm under DDP, drawn from a real run's results.

    plot_eval_statistics(runs)          # the running mean that eval uses, next to the data's
    plot_gap_by_batch_size(by_size)     # per-rank statistics vs the whole batch's, by size
    batch_size_explorer(by_size)        # one per-rank batch size at a time, with a slider
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import ipywidgets as widgets
import numpy as np
import torch
from IPython.display import display
from matplotlib.figure import Figure
from torch import nn

from course_lib.plots.explore import redrawn_below
from course_lib.plots.style import BLACK, new_figure, rank_bar_style, rank_style
from course_lib.teach.sync_batchnorm import plot_normalisation

# One rank's share of a global batch: (its input rows, its BatchNorm's output for them).
Share = tuple[torch.Tensor, torch.Tensor]
RUNNING_COLORS, RUNNING_HATCHES = (BLACK, "#FFFFFF"), ("", "\\\\")


def plot_eval_statistics(data_means: Sequence[torch.Tensor],
                         running: Mapping[str, torch.Tensor]) -> Figure:
    """Per channel: the mean of each rank's inputs and of all of them, next to the running
    mean that evaluation will use (one bar per run in `running`, label -> rank 0's buffer)."""
    channels = np.arange(len(data_means[0]))
    groups = len(data_means) + 1 + len(running)
    width = 0.8 / groups
    fig = new_figure(8.4, 4.4)  # at most JupyterLab's output width
    ax = fig.subplots()
    for rank, mean in enumerate(data_means):
        ax.bar(channels + (rank - groups / 2) * width, mean.numpy(), width,
               label=f"mean of rank {rank}'s inputs", **rank_bar_style(rank))
    everyone = torch.stack(list(data_means)).mean(0)
    at = len(data_means) - groups / 2
    ax.bar(channels + at * width, everyone.numpy(), width, label="mean of all inputs",
           color="#DDDDDD", hatch="xx", edgecolor=BLACK)
    for i, (label, mean) in enumerate(running.items(), start=1):
        bars = ax.bar(channels + (at + i) * width, mean.numpy(), width, edgecolor=BLACK,
                      color=RUNNING_COLORS[(i - 1) % 2], hatch=RUNNING_HATCHES[(i - 1) % 2],
                      label=f"running mean, {label}")
        ax.bar_label(bars, fmt="%.2f", fontsize="small", padding=2)
    ax.axhline(0, color=BLACK, lw=0.5)
    ax.set_xticks(channels, [f"channel {c}" for c in channels])
    ax.set_ylabel("mean")
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)
    ax.set_title("What eval mode will normalise with (running mean)\nvs the data all ranks saw")
    return fig


def normalisation_gap(shares: Sequence[Share]) -> float:
    """Mean |rank's normalised value - whole-batch BatchNorm's| over every value of the batch."""
    inputs = torch.cat([x for x, _ in shares]).double()
    outputs = torch.cat([out for _, out in shares]).double()
    reference = nn.functional.batch_norm(inputs, None, None, training=True)
    return (outputs - reference).abs().mean().item()


def plot_gap_by_batch_size(by_size: Mapping[int, Sequence[Sequence[Share]]]) -> Figure:
    """How far plain BatchNorm on each rank is from BatchNorm on the whole batch, against the
    per-rank batch size: one dot per global batch, and their average (`by_size`: per-rank
    size -> global batches -> per-rank shares)."""
    sizes = sorted(by_size)
    fig = new_figure(8, 3.8)
    ax = fig.subplots()
    for size in sizes:
        gaps = [normalisation_gap(shares) for shares in by_size[size]]
        ax.plot([size] * len(gaps), gaps, linestyle="none", marker="o", alpha=0.35,
                color=rank_style(0)["color"], ms=5)
    average = [np.mean([normalisation_gap(s) for s in by_size[size]]) for size in sizes]
    ax.plot(sizes, average, color=BLACK, marker="s", label="average over the global batches")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("samples per rank (2 ranks)")
    ax.set_ylabel("mean |difference| of normalised values")
    ax.set_title("Plain BatchNorm on each rank vs BatchNorm on the whole batch")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def batch_size_explorer(by_size: Mapping[int, Sequence[Sequence[Share]]]) -> widgets.Widget:
    """A slider over the per-rank batch sizes of `by_size`; each move redraws, from the
    stored results, what each rank's BatchNorm did with its share of the first global batch."""
    sizes = sorted(by_size)
    slider = widgets.SelectionSlider(options=sizes, value=sizes[0],
                                     description="per rank", continuous_update=False)

    def draw() -> Figure:
        return plot_normalisation(by_size[slider.value][0],
                                  f"{slider.value} samples per rank, plain BatchNorm")

    display(draw())
    return widgets.VBox([slider, redrawn_below(draw, slider)])
