"""Lesson 15's case files: the few measurements and pictures the cases share.

    shared_samples(run.telemetry)        # how many dataset indices two or more ranks read
    as_node(2); split_by_node(reads, 2)  # torchrun's per-node variables; a sampler split by node
    plot_curves({"as sent": losses, ...}) # loss curves on a log scale, inf/nan marked
    plot_speedup(nbytes, link, {"4 all-reduces": 4, "1": 1}, measured_s)
                                         # predicted speed-up on N ranks against compute time
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np
import torch.distributed as dist

from course_lib.teach.scaling_model import Link, predict_step


def shared_samples(tel: Any, epoch: int = 0) -> int:
    """How many dataset indices more than one rank read in `epoch` (0 when the ranks'
    shares are disjoint), from the recorder's sample records (`rec.samples`)."""
    reads = tel.samples.where(epoch=epoch)
    readers = Counter()
    for rank in tel.ranks:
        readers.update(set(reads.where(rank=rank)["index"].tolist()))
    return sum(1 for count in readers.values() if count > 1)


def as_node(nodes: int) -> None:
    """Set torchrun's per-node variables as `nodes` nodes of equal size would have them."""
    rank, per_node = dist.get_rank(), dist.get_world_size() // nodes
    os.environ.update(LOCAL_RANK=str(rank % per_node), LOCAL_WORLD_SIZE=str(per_node),
                      GROUP_RANK=str(rank // per_node), NODE_RANK=str(rank // per_node))


def split_by_node(reads: list[list[int]], nodes: int) -> bool:
    """True when, on several nodes, ranks with the same local rank read the same samples and
    the ranks of one node read different ones: a sampler told the local rank and world size
    (`reads`: each rank's dataset indices, in rank order)."""
    if nodes < 2:
        return False
    per_node = len(reads) // nodes
    seen = [set(r) for r in reads]
    same_local = all(seen[r] == seen[r % per_node] for r in range(len(seen)))
    disjoint_here = all(not seen[a] & seen[b] for a in range(per_node)
                        for b in range(a + 1, per_node))
    return same_local and disjoint_here


def plot_curves(curves: dict[str, list[float]], title: str = "",
                ylabel: str = "loss (mean over the step's batches)"):
    """One line per run on a log scale (a divergence spans orders of magnitude); a run that
    reached inf or nan ends with a red cross at the top, labelled with the run and its step
    (plots/charts.py); the legend below the chart, out of the curves' way."""
    from course_lib.plots import charts
    from course_lib.plots.style import new_figure

    ax = new_figure(8.2, 3.8).subplots()
    fig = charts.lines(curves, ylabel=ylabel, title=title, xlabel="optimizer step", log=True,
                       ax=ax)
    ax.get_legend().remove()
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=2,
               fontsize="small")
    return fig


def predicted_speedup(compute_s: float, nbytes: int, link: Link, calls: int,
                      world_size: int) -> float:
    """N x the weak-scaling efficiency: compute / (compute + `calls` all-reduces of the whole
    gradient on `link`), lesson 08's model with no overlap."""
    step_s = predict_step(compute_s, nbytes * calls, world_size, link, calls=calls)
    return world_size * compute_s / step_s


def plot_speedup(nbytes: int, link: Link, calls: dict[str, int], measured_s: float,
                 world_size: int = 8, title: str = ""):
    """Predicted speed-up on `world_size` ranks against the compute time of one optimizer
    step, one line per loop (its all-reduces per step); a dotted line at the compute time
    measured here. Faster compute (a GPU) moves left, where the network weighs more."""
    from course_lib.plots.charts import series_style
    from course_lib.plots.style import BLACK, new_figure

    fig = new_figure(7.5, 3.4)
    ax = fig.subplots()
    seconds = np.geomspace(measured_s / 100, measured_s * 3, 60)
    for i, (label, n_calls) in enumerate(calls.items()):
        style = series_style(i, markers=False)
        ax.plot(seconds * 1e3, [predicted_speedup(s, nbytes, link, n_calls, world_size)
                                for s in seconds], label=label, **style)
        here = predicted_speedup(measured_s, nbytes, link, n_calls, world_size)
        ax.plot([measured_s * 1e3], [here], series_style(i)["marker"], color=BLACK)
        ax.annotate(f"{here:.1f}x", (measured_s * 1e3, here), textcoords="offset points",
                    xytext=(6, -10), fontsize="small")
    ax.axvline(measured_s * 1e3, color=BLACK, ls=":", lw=1)
    ax.text(measured_s * 1e3, world_size * 0.02, " compute measured here", fontsize="small")
    ax.set_xscale("log")
    ax.set_ylim(0, world_size * 1.05)
    ax.axhline(world_size, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("compute per optimizer step (ms, log scale; a GPU is further left)")
    ax.set_ylabel(f"predicted speed-up on {world_size} ranks")
    ax.set_title(title or f"{nbytes / 1e6:.1f} MB of gradients on {link.label()}",
                 fontsize="medium")
    ax.legend(fontsize="small", loc="upper left")
    return fig


def speedup_explorer(nbytes: int, calls: dict[str, int], measured_s: float,
                     link: str = "10 GbE"):
    """plot_speedup() with a link menu (lesson 08's presets) and a world-size slider: the
    model redrawn, nothing run."""
    import ipywidgets as widgets
    from IPython.display import display

    from course_lib.plots.explore import redrawn_below
    from course_lib.teach.scaling_model import PRESETS

    links = widgets.Dropdown(options=list(PRESETS), value=link, description="link")
    world = widgets.SelectionSlider(options=[2, 4, 8, 16, 32, 64], value=8,
                                    description="world size")

    def draw():
        return plot_speedup(nbytes, PRESETS[links.value], calls, measured_s,
                            world_size=world.value)

    display(draw())
    return widgets.VBox([widgets.HBox([links, world]), redrawn_below(draw, links, world)])
