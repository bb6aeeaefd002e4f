"""BatchNorm statistics per rank over steps: each rank's batch statistics and running buffers."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from course_lib.plots.style import chosen_ranks, new_figure, rank_style, require, step_axis
from course_lib.telemetry import Telemetry

PANELS = (("batch_mean", "batch mean (this rank's batch)"),
          ("running_mean", "running mean (buffer at the step's start)"),
          ("batch_var", "batch variance (this rank's batch)"),
          ("running_var", "running variance (buffer at the step's start)"))


def batchnorm(tel: Telemetry, layer: str | None = None, channel: int = 0,
              ranks: list[int] | None = None) -> Figure:
    """Four panels over steps, one line per rank: batch and running mean and variance."""
    require(len(tel.batchnorm), "BatchNorm records", "call rec.watch_batchnorm(model)")
    layer = str(tel.batchnorm["layer"][0]) if layer is None else layer
    table = tel.batchnorm.where(layer=layer)
    fig = new_figure(10, 6)
    axes = fig.subplots(2, 2, sharex=True)
    for ax, (column, label) in zip(axes.flat, PANELS):
        for rank in chosen_ranks(tel, ranks):
            rows = table.where(rank=rank)
            values = [v[channel] if len(v) > channel else np.nan for v in rows[column]]
            ax.plot(rows["step"], values, label=f"rank {rank}", ms=4, **rank_style(rank))
        ax.set_title(label)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        step_axis(ax)
    axes[0, 0].legend(fontsize="small")
    fig.suptitle(f"BatchNorm layer '{layer}', channel {channel}, per rank\n"
                 "Left: each rank normalises with its own batch's statistics. Right: lines apart "
                 "= the ranks hold different running buffers")
    return fig
