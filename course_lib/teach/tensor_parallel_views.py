"""Lesson 16's pictures: each rank's output beside the one-process output, which slice of
each weight a rank holds, the collectives per layer of two plans, per-rank values against
the one-process value, and which samples each rank of a 2-D mesh read."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from matplotlib.artist import Artist
from matplotlib.colors import ListedColormap, to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from course_lib.plots.charts import bar_style
from course_lib.plots.style import BLACK, HIGHLIGHT, RANK_COLORS, new_figure
from course_lib.teach.tensor_parallel import Collectives


def plot_outputs(outputs: Sequence[torch.Tensor], reference: torch.Tensor, title: str) -> Figure:
    """Each rank's output and the one-process output, as heat maps on one colour scale;
    each rank's panel says how far it is from the one-process output."""
    panels = [(f"rank {r}", out) for r, out in enumerate(outputs)] + [("one process", reference)]
    fig = new_figure(2.3 * len(panels), 2.6)
    axes = fig.subplots(1, len(panels))
    top = max(float(t.abs().max()) for _, t in panels)
    for ax, (name, t) in zip(axes, panels):
        image = ax.imshow(t.numpy(), cmap="RdBu_r", vmin=-top, vmax=top, aspect="auto")
        gap = float((t - reference).abs().max())
        wrong = gap > 1e-5
        label = "" if name == "one process" else f"\nlargest difference {gap:.2g}"
        ax.set_title(name + label, fontsize="small", color=HIGHLIGHT if wrong else BLACK)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0].set_ylabel("sample")
    fig.colorbar(image, ax=list(axes), shrink=0.8)
    fig.suptitle(title, fontsize="medium")
    return fig


def plot_shards(shards: Sequence[Mapping[str, Mapping[str, Any]]], title: str) -> Figure:
    """Each weight as its full (out_features x in_features) matrix, every entry coloured by
    the rank that holds it (grey: every rank holds all of it)."""
    names = list(shards[0])
    fig = new_figure(2.4 * len(names) + 1.2, 2.8)
    axes = np.atleast_1d(fig.subplots(1, len(names)))
    colors = ListedColormap(["#BBBBBB", *RANK_COLORS[: len(shards)]])
    for ax, name in zip(axes, names):
        shape = shards[0][name]["shape"]
        owner = np.zeros(shape[:2] if len(shape) > 1 else (1, shape[0]), dtype=int)
        for rank, layout in enumerate(shards):
            piece = layout[name]
            if piece["dim"] is not None:
                index = [slice(None), slice(None)]
                index[piece["dim"]] = slice(piece["start"], piece["stop"])
                owner[tuple(index)] = rank + 1
        ax.imshow(owner, cmap=colors, vmin=0, vmax=len(shards), aspect="auto",
                  interpolation="nearest")
        ax.set_title(f"{name}\n{list(shape)}, {shards[0][name]['placement']}", fontsize="small")
        ax.set_xlabel("in_features (dim 1)", fontsize="x-small")
        ax.set_ylabel("out_features (dim 0)", fontsize="x-small")
        ax.set_xticks([])
        ax.set_yticks([])
    legend = [Patch(color=RANK_COLORS[r], label=f"rank {r}") for r in range(len(shards))]
    legend.append(Patch(color="#BBBBBB", label="every rank, whole"))
    fig.legend(handles=legend, loc="outside right center", fontsize="small")
    fig.suptitle(title, fontsize="medium")
    return fig


PASSES = ("forward", "backward")


def plot_collectives(runs: Mapping[str, Collectives], title: str) -> Figure:
    """One panel per plan: per layer (in the model's order), the collectives of the forward
    (plain) and of the backward (hatched), each bar labelled with the collective's name."""
    rows = max(len(c.layers()) for c in runs.values())
    fig = new_figure(min(8.2, 4.0 * len(runs)), 1.2 + 0.5 * rows)
    axes = np.atleast_1d(fig.subplots(1, len(runs), sharex=True, sharey=True))
    for ax, (plan, seen) in zip(axes, runs.items()):
        layers = seen.layers()
        for y, name in enumerate(layers):
            left = 0
            for k, part in enumerate(PASSES):
                for op, n in layers[name].get(part, {}).items():
                    bar = ax.barh(y, n, left=left, height=0.6, **_bar(k))
                    ax.bar_label(bar, [op], label_type="center", fontsize="small")
                    left += n
        ax.set_yticks(range(len(layers)), list(layers), fontsize="small")
        fwd, bwd = seen.total(("forward",)), seen.total(("backward",))
        ax.set_title(f"{plan}:\n{fwd} in forward, {bwd} in backward", fontsize="small")
        ax.set_xlabel("collectives per step", fontsize="small")
    axes[0].invert_yaxis()
    legend = [_patch(_bar(k), part) for k, part in enumerate(PASSES)]
    fig.legend(handles=legend, fontsize="small", loc="outside lower center", ncols=2)
    fig.suptitle(title, fontsize="medium")
    return fig


def _bar(k: int) -> dict[str, Any]:
    """The look of pass k's bars: the forward plain, the backward hatched."""
    return {**bar_style(k), "color": RANK_COLORS[k]}


def plot_per_rank(runs: Mapping[str, Sequence[float]], reference: float, *, ylabel: str,
                  title: str, fmt: str = "{:.4f}", reference_label: str = "one process",
                  problem: str = "off the line") -> Figure:
    """One group of bars per run, one bar per rank, and a line at the one-process value.
    A bar that shows the problem has a red edge: one `problem="off the line"` (a value that
    should equal one process's), or one "at the line" (a size that should be a share of it)."""
    if problem not in ("off the line", "at the line"):
        raise ValueError(f'problem={problem!r}: "off the line" or "at the line"')
    ranks = max(len(v) for v in runs.values())
    fig = new_figure(min(8.2, 2.6 + 0.9 * sum(len(v) for v in runs.values())), 3.6)
    ax = fig.subplots()
    x, ticks = 0.0, []
    for values in runs.values():
        start = x
        for rank, value in enumerate(values):
            bar = ax.bar(x, value, width=0.8, **bar_style(rank))
            off = abs(value - reference) > 1e-4 * max(1.0, abs(reference))
            if off == (problem == "off the line"):
                bar[0].set(edgecolor=HIGHLIGHT, linewidth=2.5)
            ax.bar_label(bar, [fmt.format(value)], fontsize="x-small")
            x += 1
        ticks.append((start + x - 1) / 2)
        x += 0.8
    ax.axhline(reference, color=BLACK, linestyle="--", linewidth=1)
    ax.set_xticks(ticks, [textwrap.fill(run, 24) for run in runs], fontsize="small")
    low = min(min(v) for v in runs.values())
    ax.set_ylim(min(0.0, low), max(max(max(v) for v in runs.values()), reference) * 1.25)
    ax.set_ylabel(ylabel)
    legend: list[Artist] = [_patch(bar_style(r), f"rank {r}") for r in range(ranks)]
    legend.append(Line2D([], [], color=BLACK, linestyle="--",
                         label=f"{reference_label}: {fmt.format(reference)}"))
    legend.append(Patch(facecolor="white", edgecolor=HIGHLIGHT, linewidth=2.5,
                        label="the problem"))
    fig.legend(handles=legend, fontsize="x-small", loc="outside lower center",
               ncols=min(len(legend), 4))
    fig.suptitle(title, fontsize="medium")
    return fig


def plot_mesh_samples(runs: Mapping[str, Sequence[Mapping[str, Any]]], shape: tuple[int, int],
                      title: str) -> Figure:
    """One grid per run, a cell per rank laid out as the mesh (rows: data-parallel rank,
    columns: tensor-parallel rank): the samples it read and its seed. Tensor-parallel peers
    that read different samples or seeds are outlined in red."""
    fig = new_figure(min(8.2, 4.0 * len(runs)), 1.1 + 1.1 * shape[0])
    axes = np.atleast_1d(fig.subplots(1, len(runs)))
    for ax, (run, ranks) in zip(axes, runs.items()):
        for rank, result in enumerate(ranks):
            row, col = divmod(rank, shape[1])
            peers = [ranks[row * shape[1] + c] for c in range(shape[1])]
            differ = any((p["samples"], p["seed"]) != (result["samples"], result["seed"])
                         for p in peers)
            ax.add_patch(_cell(col, row, RANK_COLORS[row], differ))
            text = f"rank {rank}\nsamples {_short(result['samples'])}\nseed {result['seed']}"
            if "loss" in result:
                text += f"\nloss {result['loss']:.4f}"
            ax.text(col + 0.5, row + 0.5, text, ha="center", va="center", fontsize="x-small")
        ax.set_xlim(0, shape[1])
        ax.set_ylim(shape[0], 0)
        ax.set_xticks([c + 0.5 for c in range(shape[1])],
                      [f"tp {c}" for c in range(shape[1])], fontsize="small")
        ax.set_yticks([r + 0.5 for r in range(shape[0])],
                      [f"dp {r}" for r in range(shape[0])], fontsize="small")
        ax.set_title(run, fontsize="small")
    fig.suptitle(title, fontsize="medium")
    return fig


def _patch(style: dict[str, Any], label: str) -> Patch:
    """A legend entry with a bar's look (Patch takes a facecolor, not a bar's color)."""
    return Patch(facecolor=style["color"], hatch=style["hatch"], edgecolor=style["edgecolor"],
                 label=label)


def _cell(col: int, row: int, color: str, differ: bool) -> Rectangle:
    return Rectangle((col + 0.04, row + 0.06), 0.92, 0.88, facecolor=to_rgba(color, 0.25),
                     edgecolor=HIGHLIGHT if differ else BLACK, linewidth=3 if differ else 1)


def _short(samples: Sequence[int]) -> str:
    shown = ", ".join(str(s) for s in samples[:4])
    return f"[{shown}, ...]" if len(samples) > 4 else f"[{shown}]"
