"""Gradient norms per parameter on every rank, before and after the all-reduce."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from course_lib.plots.style import HIGHLIGHT, chosen_ranks, new_figure, rank_style, require
from course_lib.telemetry import Table, Telemetry

DODGE = 0.1  # horizontal offset between ranks, so equal values stay visible side by side


def gradients(tel: Telemetry, step: int | None = None, ranks: list[int] | None = None) -> Figure:
    """Two panels, before and after the all-reduce: each rank's gradient norm per parameter.

    Parameters whose reduced gradients differ between ranks are shaded.
    """
    require(len(tel.grads), "gradient records",
            "call rec.watch_ddp(model) or rec.gradients(model, 'before'/'after')")
    step = int(tel.grads["step"].max()) if step is None else step
    table = tel.grads.where(step=step)
    params = _parameters(table)
    ranks = chosen_ranks(tel, ranks)
    fig = new_figure(max(8.0, 0.7 * len(params) + 4), 4.6)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, when in zip(axes, ("before", "after")):
        _draw(ax, table.where(when=when), params, ranks)
    differ = _differing(table.where(when="after"), params, ranks)
    for i in differ:
        axes[1].axvspan(i - 0.5, i + 0.5, color=HIGHLIGHT, alpha=0.2, hatch="//", lw=0)
    axes[0].set_title("before all-reduce: each rank's own")
    axes[1].set_title(_after_title(differ, params, table.where(when="after")))
    axes[0].set_ylabel("gradient norm")
    axes[0].legend(loc="best", fontsize="small")
    fig.suptitle(f"Gradient norm per parameter and rank, step {step}\n"
                 "Before the all-reduce each rank has its own gradient; after it, every rank "
                 "should hold the same one")
    return fig


def _parameters(table: Table) -> list[str]:
    """Parameter names in model order."""
    order = dict(zip(table["param"].tolist(), table["index"].tolist()))
    return sorted(order, key=order.get)


def _per_rank(table: Table, params: list[str], rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Norms and first values per parameter for one rank (NaN where not recorded)."""
    norms = np.full(len(params), np.nan)
    values: list[np.ndarray | None] = [None] * len(params)
    for _, _, _, _, param, _, norm, vals in table.where(rank=rank).rows():
        i = params.index(param)
        norms[i], values[i] = norm, np.asarray(vals)  # a later record of a parameter wins
    return norms, values


def _draw(ax, table: Table, params: list[str], ranks: list[int]) -> None:
    x = np.arange(len(params))
    for k, rank in enumerate(ranks):
        norms, _ = _per_rank(table, params, rank)
        offset = (k - (len(ranks) - 1) / 2) * DODGE
        ax.plot(x + offset, norms, label=f"rank {rank}", lw=1, ms=6, **rank_style(rank))
    ax.set_xticks(x, params, rotation=45, ha="right")
    ax.set_xlabel("parameter")
    ax.grid(axis="y", alpha=0.3)
    if len(table) and np.all(table["norm"] > 0) and np.ptp(np.log10(table["norm"])) > 2:
        ax.set_yscale("log")


def _differing(table: Table, params: list[str], ranks: list[int]) -> list[int]:
    """Positions of parameters whose reduced norm or first values are not equal on all ranks."""
    if len(ranks) < 2:
        return []
    (norms0, values0), *others = [_per_rank(table, params, r) for r in ranks]
    return [i for i in range(len(params))
            if not all(_same(norms0[i], n[i], values0[i], v[i]) for n, v in others)]


def _same(norm_a: float, norm_b: float, vals_a: np.ndarray | None,
          vals_b: np.ndarray | None) -> bool:
    if vals_a is None or vals_b is None:
        return vals_a is vals_b
    return bool(np.isclose(norm_a, norm_b, rtol=1e-6, atol=0)
                and np.allclose(vals_a, vals_b, rtol=1e-6, atol=1e-12, equal_nan=True))


def _after_title(differ: list[int], params: list[str], after: Table) -> str:
    if not len(after):
        return "after all-reduce: nothing recorded"
    if differ:
        return f"after all-reduce: {len(differ)} of {len(params)} differ between ranks (shaded)"
    return "after all-reduce: identical on every rank"
