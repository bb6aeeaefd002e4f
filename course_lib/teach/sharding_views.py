"""Lesson 03's pictures: which epoch each rank was in at each of DDP's all-reduces, and an
explorer of the sample-index heatmap for different sampler settings."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import ipywidgets as widgets
import numpy as np
from IPython.display import display
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from course_lib.plots.samples import samples
from course_lib.plots.style import BLACK, BLUE, GREEN, HIGHLIGHT, ORANGE, PURPLE, new_figure
from course_lib.telemetry import Telemetry

EPOCH_COLORS = (BLUE, ORANGE, GREEN, PURPLE)


def epochs_by_allreduce(tel: Telemetry, name: str = "epoch") -> np.ndarray:
    """A (rank, all-reduce) grid of the epoch each rank recorded at its k-th step; -1 where a
    rank made fewer steps. DDP pairs the ranks' k-th all-reduces, whatever their epochs."""
    rows = [tel.scalars.where(rank=r, name=name) for r in tel.ranks]
    steps = max((int(t["step"].max()) for t in rows if len(t)), default=0)
    grid = np.full((len(rows), steps), -1)
    for r, table in enumerate(rows):
        grid[r, table["step"].astype(int) - 1] = table["value"].astype(int)
    return grid


def mixed_allreduces(tel: Telemetry) -> int:
    """How many all-reduces averaged gradients from different epochs."""
    grid = epochs_by_allreduce(tel)
    both = (grid >= 0).all(axis=0)
    return int(np.sum(both & (grid != grid[0]).any(axis=0)))


def epoch_pairing(tel: Telemetry) -> Figure:
    """One row per rank, one column per DDP all-reduce, coloured by the epoch each rank was in;
    columns whose ranks were in different epochs are framed."""
    grid = epochs_by_allreduce(tel)
    ranks, steps = grid.shape
    fig = new_figure(max(7.0, 1.5 + 0.7 * steps), 2.0 + 0.55 * ranks)
    ax = fig.subplots()
    colors = ListedColormap(["white", *EPOCH_COLORS[: max(1, grid.max() + 1)]])
    ax.imshow(grid + 1, cmap=colors, vmin=0, vmax=colors.N - 1, aspect="auto")
    for (r, k), epoch in np.ndenumerate(grid):
        ax.text(k, r, "gone" if epoch < 0 else f"epoch {epoch}", ha="center", va="center",
                fontsize="small", color=BLACK if epoch < 0 else "white")
    mixed = (grid != grid[0]).any(axis=0)
    for k in np.nonzero(mixed)[0]:
        ax.add_patch(Rectangle((k - 0.5, -0.5), 1, ranks, fill=False, lw=3, ec=BLACK))
    ax.set_yticks(range(ranks), [f"rank {r}" for r in tel.ranks])
    ax.set_xticks(range(steps), [f"{k + 1}\n✕" if mixed[k] else str(k + 1) for k in range(steps)])
    for label, bad in zip(ax.get_xticklabels(), mixed):
        label.set_color(HIGHLIGHT if bad else BLACK)
    ax.set_xlabel("DDP all-reduce number (one per training step)")
    unpaired = int(np.sum((grid < 0).any(axis=0)))
    ax.set_title(f"Which epoch each rank was in at each DDP all-reduce\n"
                 f"✕ framed: {mixed_allreduces(tel)} averaged gradients from different epochs, "
                 f"{unpaired} had no partner", loc="left", fontsize="medium")
    return fig


def sharding_explorer(read: Callable[[int, bool, bool], Telemetry],
                      dataset_size: int) -> widgets.Widget:
    """plots.samples for a world size, set_epoch on or off, and drop_last on or off.

    read(world_size, set_epoch, drop_last) launches the reading and returns its telemetry;
    each setting runs once, so going back to a setting redraws at once. The default
    setting's figure is displayed first, for viewers without widgets."""
    cached = cache(read)
    world = widgets.IntSlider(2, 2, 4, description="world size")
    set_epoch = widgets.Checkbox(True, description="set_epoch(epoch)")
    drop_last = widgets.Checkbox(False, description="drop_last=True")
    display(samples(cached(world.value, set_epoch.value, drop_last.value), dataset_size))
    out = widgets.Output()

    def redraw(_: object = None) -> None:
        with out:
            out.clear_output(wait=True)
            tel = cached(world.value, set_epoch.value, drop_last.value)
            display(samples(tel, dataset_size))

    for control in (world, set_epoch, drop_last):
        control.observe(redraw, "value")
    return widgets.VBox([widgets.HBox([world, set_epoch, drop_last]), out])
