"""Which dataset indices each rank read, per epoch: duplicates and gaps stand out."""

from __future__ import annotations

import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from course_lib.plots.style import BLACK, SKY, VERMILLION, new_figure, require
from course_lib.telemetry import Telemetry

COLORS = ("white", SKY, VERMILLION)  # read 0 times, once, more than once
LABELS = ("not read", "read once", "read more than once")
WIDTH = 8.4  # inches: about JupyterLab's 848-pixel output at 100 dpi, so text is not shrunk
CROSSES_UP_TO = 128  # indices; beyond, a cross per column would be a smear


def samples(tel: Telemetry, dataset_size: int | None = None) -> Figure:
    """One panel per epoch: a row per rank plus an "all ranks" row; a column per index."""
    require(len(tel.samples), "sample records", "wrap the sampler with rec.watch_sampler(...)")
    size = dataset_size or int(tel.samples["index"].max()) + 1
    epochs = tel.samples.unique("epoch")
    fig = new_figure(WIDTH, 1.5 + len(epochs) * (0.6 + 0.32 * (len(tel.ranks) + 1)))
    axes = np.atleast_1d(fig.subplots(len(epochs), 1, sharex=True, squeeze=False)[:, 0])
    for ax, epoch in zip(axes, epochs):
        _epoch_panel(ax, tel, epoch, size)
    axes[-1].set_xlabel("dataset index")
    fig.legend(handles=[Patch(facecolor=c, edgecolor=BLACK, label=lab)
                        for c, lab in zip(COLORS, LABELS)], loc="outside lower center", ncols=3)
    fig.suptitle("Which dataset indices each rank read, per epoch\n"
                 "The 'all ranks' row should show every index exactly once", fontsize="medium")
    return fig


def _epoch_panel(ax, tel: Telemetry, epoch: int, size: int) -> None:
    table = tel.samples.where(epoch=epoch)
    counts = np.array([np.bincount(table.where(rank=r)["index"].astype(int), minlength=size)
                       for r in tel.ranks])
    grid = np.vstack([counts, counts.sum(axis=0)])
    ax.imshow(np.minimum(grid, 2), aspect="auto", interpolation="nearest",
              cmap=ListedColormap(COLORS), norm=BoundaryNorm([-0.5, 0.5, 1.5, 2.5], 3))
    if size <= CROSSES_UP_TO:  # a second cue beside the colour, where it stays legible
        rows, cols = np.nonzero(grid > 1)
        ax.scatter(cols, rows, marker="x", color=BLACK, s=18, linewidths=1)
    ax.set_yticks(range(len(grid)), [f"rank {r}" for r in tel.ranks] + ["all ranks"])
    ax.axhline(len(tel.ranks) - 0.5, color=BLACK, lw=1.5)
    repeated, missed = int(np.sum(grid[-1] > 1)), int(np.sum(grid[-1] == 0))
    ax.set_title(f"epoch {epoch}: {_indices(repeated)} read more than once, {_indices(missed)} "
                 "not read", fontsize="medium", loc="left")


def _indices(n: int) -> str:
    return f"{n} index" if n == 1 else f"{n} indices"
