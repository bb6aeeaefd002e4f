"""Mixed precision seen from real runs: gradient magnitudes against fp16's smallest value,
which operations autocast ran in which dtype, what DDP sends, and GradScaler's scale.

    magnitudes(model)                    # |p.grad| of every parameter, flat (zeros kept)
    plot_grad_histograms({"fp16": [g_rank0, g_rank1], ...})   # per rank, vs FP16_TINY
    with autocast_ops() as ops: model(x) # the aten ops that ran, with their dtypes
    op_table(ops)                        # one row per op: input and output dtypes
    with sent() as calls: loss.backward()   # dtype and bytes of each all-reduce DDP made
    plot_scale(scales)                   # GradScaler's scale per step, skipped steps marked
    underflow_explorer(underflow_sweep(model, x, y, weights))  # where fp16 gradients vanish

The drawing functions import matplotlib themselves: ranks import this module and should not
pay for the plotting stack.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

# fp16's smallest positive (subnormal) value, 2**-24: anything smaller in magnitude becomes 0.
FP16_TINY = float(torch.finfo(torch.float16).smallest_normal) * 2.0**-10
# Ops that only move or view data: left out of the table of what autocast computed.
_PLUMBING = frozenset({"detach", "view", "t", "expand", "alias", "_to_copy", "empty", "zeros",
                       "ones", "copy_", "clone", "transpose", "unsqueeze", "squeeze",
                       "reshape", "lift_fresh"})


def magnitudes(model: torch.nn.Module) -> torch.Tensor:
    """|p.grad| of every parameter in one flat float64 tensor (None counts as zeros)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach()
                      .abs().double().flatten() for p in model.parameters()])


def nonzero_share(grads: torch.Tensor) -> float:
    """The share of gradient entries that are not exactly zero."""
    return float((grads != 0).double().mean()) if grads.numel() else 0.0


# -- what autocast does per operation ------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """One aten operation as it ran: its name, its tensor inputs' and output's dtypes."""

    name: str
    inputs: tuple[str, ...]
    output: str


class _OpLog(TorchDispatchMode):
    """Records every aten op below autocast, so it sees the dtypes autocast chose."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Op] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket.__name__)
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        self.ops.append(Op(name, tuple(_dtype(a) for a in args if isinstance(a, torch.Tensor)),
                           _dtype(first) if isinstance(first, torch.Tensor) else "-"))
        return out


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


@contextmanager
def autocast_ops() -> Iterator[list[Op]]:
    """Every aten op run inside the block, in order, with the dtypes it really used."""
    log = _OpLog()
    with log:
        yield log.ops


def op_table(ops: list[Op]) -> str:
    """A text table of the ops that computed, in order (casts and views left out, counted)."""
    casts = sum(op.name == "_to_copy" for op in ops)
    rows = [(op.name, ", ".join(op.inputs), op.output,
             "low precision" if op.output in ("float16", "bfloat16") else op.output)
            for op in ops if op.name not in _PLUMBING]
    head = ("op", "input dtypes", "output", "ran in")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + [f"(and {casts} casts, _to_copy, that autocast inserted)"])


# -- what DDP sends -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sent:
    """One all-reduce: the dtype and the bytes of the tensor sent."""

    dtype: str
    nbytes: int


@contextmanager
def sent() -> Iterator[list[Sent]]:
    """Record the dtype and size of every dist.all_reduce called in this process in the block
    (DDP's default reduction and its comm hooks call it)."""
    calls: list[Sent] = []
    original = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        calls.append(Sent(_dtype(tensor), tensor.numel() * tensor.element_size()))
        return original(tensor, *args, **kwargs)

    dist.all_reduce = all_reduce
    try:
        yield calls
    finally:
        dist.all_reduce = original


# -- pictures --------------------------------------------------------------------------------------

def plot_grad_histograms(runs: dict[str, list[torch.Tensor]], bins: int = 40):
    """One panel per run: each rank's histogram of log10 |gradient| (one tensor: one
    process's), the exact zeros as a bar of their own at the left, fp16's smallest value as a
    line."""
    import numpy as np

    from course_lib.plots.style import HIGHLIGHT, new_figure, rank_bar_style, rank_style

    fig = new_figure(min(8.4, 4.2 * len(runs)), 4.0)  # at most JupyterLab's output width
    axes = np.atleast_1d(fig.subplots(1, len(runs), sharey=True))
    every = torch.cat([g[g > 0] for grads in runs.values() for g in grads])
    low = min(np.log10(FP16_TINY) - 2, float(every.log10().min()) if every.numel() else -9)
    high = float(every.log10().max()) + 0.5 if every.numel() else 0.0
    edges = np.linspace(low, high, bins + 1)
    zero_at = low - 1.0
    for ax, (name, grads) in zip(axes, runs.items()):
        ax.axvspan(low, np.log10(FP16_TINY / 2), color=HIGHLIGHT, alpha=0.08,
                   label="rounds to 0 in fp16")
        ax.axvline(np.log10(FP16_TINY), color=HIGHLIGHT, linestyle="--",
                   label="fp16's smallest value, 2⁻²⁴")
        for rank, g in enumerate(grads):
            style = rank_style(rank)
            ax.hist(g[g > 0].log10().numpy(), bins=edges, histtype="step", color=style["color"],
                    linestyle=style["linestyle"], linewidth=2.5 if rank == 0 else 1.5,
                    label=(f"rank {rank}: " if len(grads) > 1 else "")
                    + f"{100 * nonzero_share(g):.0f}% non-zero")
            ax.bar(zero_at + 0.3 * (rank - (len(grads) - 1) / 2), int((g == 0).sum()),
                   width=0.3, **rank_bar_style(rank))
        ticks = list(range(int(np.ceil(low)), int(high) + 1, 2))
        ax.set_xticks([zero_at] + ticks)
        ax.set_xticklabels(["= 0"] + [f"1e{t}" for t in ticks])
        ax.set_xlim(zero_at - 0.6, high)
        ax.set_xlabel("|gradient| (log scale; left bars: exactly 0)")
        ax.set_title(name, fontsize="medium")
        ax.legend(fontsize="small", loc="best")
    axes[0].set_ylabel("parameters")
    return fig


def plot_losses(curves: dict[str, list[float]], title: str = ""):
    """Loss after each optimizer step, one line per run."""
    from course_lib.plots import charts

    return charts.lines(curves, ylabel="loss (fixed evaluation batch)", title=title,
                        xlabel="optimizer step")


def plot_scale(scales: dict[int, list[float]], skipped: dict[int, list[int]]):
    """GradScaler's scale used at each step, per rank, with the skipped steps marked."""
    from course_lib.plots.style import HIGHLIGHT, new_figure, rank_style, step_axis

    fig = new_figure(7, 3.2)
    ax = fig.subplots()
    for rank, values in scales.items():
        ax.plot(range(len(values)), values, label=f"rank {rank}", markersize=3,
                **rank_style(rank))
    for rank, steps in skipped.items():
        ax.plot(steps, [scales[rank][s] for s in steps], "x", color=HIGHLIGHT, markersize=9,
                label="skipped step (inf/nan found)" if rank == 0 else None)
    ax.set_yscale("log", base=2)
    step_axis(ax)
    ax.set_ylabel("loss scale")
    ax.set_title("GradScaler: the scale each step used", fontsize="medium")
    ax.legend(fontsize="small")
    return fig


# -- where underflow starts -------------------------------------------------------------------

SETUPS = {"fp16, no scaler": (torch.float16, 1.0), "fp16 + GradScaler (x65536)":
          (torch.float16, 65536.0), "bf16, no scaler": (torch.bfloat16, 1.0)}


def underflow_sweep(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                    weights: list[float]) -> dict[float, dict[str, torch.Tensor]]:
    """Per loss weight w, the fp32 gradient magnitudes of w * MSE and, per setup of SETUPS,
    those of one autocast backward (scaled, then unscaled in fp32, as GradScaler does)."""
    grid = {}
    for w in weights:
        grid[w] = {"fp32": _grads(model, x, y, w, None, 1.0)}
        for name, (dtype, scale) in SETUPS.items():
            grid[w][name] = _grads(model, x, y, w, dtype, scale)
    return grid


def _grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, weight: float,
           dtype: torch.dtype | None, scale: float) -> torch.Tensor:
    model.zero_grad()
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = weight * torch.nn.functional.mse_loss(model(x), y)
    (loss * scale).backward()
    grads = magnitudes(model) / scale
    model.zero_grad()
    return grads


def plot_underflow(grid: dict[float, dict[str, torch.Tensor]]):
    """Share of non-zero gradients against the loss weight, one line per setup."""
    from course_lib.plots.charts import series_style
    from course_lib.plots.style import new_figure

    fig = new_figure(7, 3.2)
    ax = fig.subplots()
    weights = sorted(grid)
    for i, name in enumerate(["fp32", *SETUPS]):
        ax.plot(weights, [100 * nonzero_share(grid[w][name]) for w in weights], label=name,
                **series_style(i))
    ax.set_xscale("log")
    ax.set_xlabel("loss weight w (loss = w × MSE)")
    ax.set_ylabel("% of gradients non-zero")
    ax.set_title("Where fp16 gradients start to vanish", fontsize="medium")
    ax.legend(fontsize="small")
    return fig


def underflow_explorer(grid: dict[float, dict[str, torch.Tensor]]):
    """plot_underflow(grid), then a slider over the loss weights that draws that weight's
    histograms from the cached sweep (moving it computes nothing)."""
    import ipywidgets as widgets
    from IPython.display import display

    from course_lib.plots.explore import redrawn_below

    display(plot_underflow(grid))
    weights = sorted(grid)
    slider = widgets.SelectionSlider(options=[(f"{w:.0e}", w) for w in weights],
                                     value=weights[len(weights) // 2], description="loss weight")

    def draw():
        return plot_grad_histograms({name: [g] for name, g in grid[slider.value].items()
                                     if name != "bf16, no scaler"})

    display(draw())
    return widgets.VBox([slider, redrawn_below(draw, slider)])
