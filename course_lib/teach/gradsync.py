"""Are the gradients in sync? After backward, DDP leaves the same averaged gradient on every
rank. verify_gradients() checks that on real ranks: every rank calls it (it is a collective),
and every rank gets the same report.

    loss.backward()
    report = verify_gradients(ddp_model)
    print(report)                  # one readable verdict line
    report.in_sync, report.max_difference, report.differences["fc1.weight"]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from course_lib.wrappers import unwrap

# Differences below this share of the gradient's size count as equal (reduction order).
DEFAULT_RTOL = 1e-6


@dataclass(frozen=True)
class GradSyncReport:
    """What verify_gradients() found, the same on every rank.

    differences: per parameter (model order), the largest difference between any two
    ranks' gradients, over all its elements (0.0 when equal; nan when some ranks have
    no gradient for it). scales: per parameter, the largest |gradient| on any rank.
    missing: parameters whose gradient is None on some ranks but not on others.
    """

    world_size: int
    differences: dict[str, float]
    scales: dict[str, float]
    missing: tuple[str, ...] = ()
    rtol: float = DEFAULT_RTOL
    unused: tuple[str, ...] = field(default=())  # gradient None on every rank

    @property
    def out_of_sync(self) -> list[str]:
        """The parameters whose gradients differ between ranks (missing ones included)."""
        return [name for name, diff in self.differences.items()
                if name in self.missing or diff > self.rtol * self.scales[name]]

    @property
    def in_sync(self) -> bool:
        """True when every rank holds the same gradient for every parameter."""
        return not self.out_of_sync

    @property
    def max_difference(self) -> float:
        """The largest difference between ranks over all parameters (0.0 when in sync)."""
        known = [d for d in self.differences.values() if not math.isnan(d)]
        return max(known, default=0.0)

    def verdict(self) -> str:
        """One line: in sync or not, and the worst parameter."""
        n, ranks = len(self.differences), f"{self.world_size} ranks"
        if self.in_sync:
            return (f"gradients in sync: all {n} parameters hold the same gradient on all "
                    f"{ranks} (largest difference {self.max_difference:.3g})")
        bad = self.out_of_sync
        worst = max(bad, key=lambda k: (k in self.missing, self.differences[k]))
        if worst in self.missing:
            what = f"{worst} has a gradient on some ranks only"
        else:
            what = f"largest: {worst}, {self.differences[worst]:.3g}"
        return (f"gradients OUT OF SYNC on {ranks}: {len(bad)} of {n} parameters differ "
                f"({what})")

    def table(self) -> str:
        """One line per parameter: its largest difference between ranks and a mark."""
        width = max(len(k) for k in self.differences) if self.differences else 9
        lines = [f"{'parameter':<{width}}  max difference  {'':>6}"]
        bad = set(self.out_of_sync)
        for name, diff in self.differences.items():
            shown = "missing" if name in self.missing else f"{diff:.3g}"
            lines.append(f"{name:<{width}}  {shown:>14}  {'DIFFER' if name in bad else 'equal'}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.verdict()


def verify_gradients(model: nn.Module, rtol: float = DEFAULT_RTOL,
                     group: dist.ProcessGroup | None = None) -> GradSyncReport:
    """Compare every parameter's gradient across all ranks; every rank must call this.

    Two all-reduces (MAX and MIN over ranks, element by element, plus a flag for gradients
    that are None) give each parameter's largest difference between any two ranks.
    Works on a DDP model or a plain one (names are the inner model's).
    """
    module = unwrap(model)
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("verify_gradients(): the model has no trainable parameters")
    device = named[0][1].device
    has = torch.tensor([p.grad is not None for _, p in named], dtype=torch.float64,
                       device=device)
    flat = torch.cat([(p.grad.detach() if p.grad is not None else torch.zeros_like(p))
                      .reshape(-1).to(torch.float64) for _, p in named])
    packed = torch.cat([has, flat])
    high, low = packed.clone(), packed.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    k = len(named)
    has_any, has_all = high[:k].cpu(), low[:k].cpu()
    spread = (high[k:] - low[k:]).cpu()
    size = torch.maximum(high[k:].abs(), low[k:].abs()).cpu()
    differences, scales, missing, unused = {}, {}, [], []
    offset = 0
    for i, (name, p) in enumerate(named):
        part = slice(offset, offset + p.numel())
        offset += p.numel()
        scales[name] = float(size[part].max()) if p.numel() else 0.0
        if has_any[i] and not has_all[i]:
            missing.append(name)
            differences[name] = math.nan
        else:
            if not has_any[i]:
                unused.append(name)
            differences[name] = float(spread[part].max()) if p.numel() else 0.0
    return GradSyncReport(dist.get_world_size(group), differences, scales, tuple(missing),
                          rtol, tuple(unused))


def plot_differences(reports: dict[str, GradSyncReport], floor: float = 1e-12):
    """Bars per parameter: the largest difference between ranks, one group per report
    (e.g. {"DDP": ok, "clipped on rank 0 only": bad}), on a log scale. A difference of
    exactly 0 is drawn at `floor`, with the label 0."""
    import numpy as np

    from course_lib.plots.style import BLACK, HIGHLIGHT, RANK_COLORS, new_figure

    names = list(next(iter(reports.values())).differences)
    fig = new_figure(min(8.4, max(6.0, 0.9 * len(names) + 3)), 3.8)
    ax = fig.subplots()
    width = 0.8 / len(reports)
    hatches = ("", "//", "..", "xx")
    for j, (label, report) in enumerate(reports.items()):
        diffs = np.array([report.differences[n] for n in names], dtype=float)
        shown = np.where(np.isnan(diffs) | (diffs <= floor), floor, diffs)
        x = np.arange(len(names)) + (j - (len(reports) - 1) / 2) * width
        colour = HIGHLIGHT if not report.in_sync else RANK_COLORS[j % len(RANK_COLORS)]
        state = "in sync" if report.in_sync else "OUT OF SYNC"
        bars = ax.bar(x, shown, width, label=f"{label}: {state}", color=colour,
                      hatch=hatches[j % len(hatches)], edgecolor=BLACK)
        ax.bar_label(bars, ["0" if d == 0 else ("none" if np.isnan(d) else f"{d:.2g}")
                            for d in diffs], fontsize="small")
    ax.set_yscale("log")
    worst = max((r.max_difference for r in reports.values()), default=0.0)
    ax.set_ylim(floor / 3, max(1.0, worst) * 1000)  # room for the legend
    ax.set_xticks(np.arange(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("largest difference between ranks")
    ax.legend(fontsize="small", loc="upper left")
    ax.set_title("Gradients after backward, compared across ranks (0 = identical on every rank)")
    return fig


GRADIENT_DIFFERENCE = "gradient difference"  # the scalar name plot_sync_per_step() reads


def plot_sync_per_step(tel, title: str = "", steps: int | None = None, floor: float = 1e-12):
    """Two panels over steps, one mark per rank: how many gradient-bucket all-reduces DDP
    made (from rec.watch_ddp's comm hook, which does not see other collectives), and the
    largest gradient difference between ranks after backward (recorded as
    rec.scalar("gradient difference", report.max_difference)).
    `steps`: how many steps the job meant to run; steps with no record are shaded as not
    reached (a crash). A difference of exactly 0 is drawn at `floor` and labelled 0."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    from course_lib.plots.style import new_figure, rank_bar_style, rank_style

    diffs = tel.scalars.where(name=GRADIENT_DIFFERENCE)
    seen = set(diffs["step"].tolist()) | set(tel.comms["step"].tolist())
    last = max(seen, default=-1) + 1
    count = max(last, steps or 0, 1)
    fig = new_figure(10, 3.6)
    calls_ax, diff_ax = fig.subplots(1, 2)
    width = 0.8 / max(1, len(tel.ranks))
    for k, rank in enumerate(tel.ranks):
        offset = (k - (len(tel.ranks) - 1) / 2) * width
        mine = tel.comms.where(rank=rank)
        counts = [int(np.sum(mine["step"] == s)) for s in range(last)]
        bars = calls_ax.bar(np.arange(last) + offset, counts, width, label=f"rank {rank}",
                            **rank_bar_style(rank))
        calls_ax.bar_label(bars, [str(c) for c in counts], fontsize="small")
        rows = diffs.where(rank=rank)
        values = rows["value"].astype(float)
        x = rows["step"].astype(float) + offset / 2
        diff_ax.plot(x, np.maximum(values, floor), ms=8, lw=1, label=f"rank {rank}",
                     **rank_style(rank))
        for xi, v in zip(x, values if k == 0 else []):  # every rank got the same report
            diff_ax.annotate("0" if v == 0 else f"{v:.2g}", (xi, max(v, floor)),
                             textcoords="offset points", xytext=(0, 8), ha="center",
                             fontsize="small")
    for ax in (calls_ax, diff_ax):
        ax.set_xticks(range(count), [str(s) for s in range(count)])
        ax.set_xlim(-0.6, count - 0.4)
        ax.set_xlabel("step")
        ax.grid(axis="y", alpha=0.3)
        if last < count:
            ax.axvspan(last - 0.5, count - 0.4, color="#DDDDDD", hatch="..", lw=0)
            ax.text((last + count - 1) / 2, 0.5, "not reached\n(the job crashed)",
                    transform=ax.get_xaxis_transform(), ha="center", va="center")
    calls_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    calls_ax.set_ylim(0, max(2, calls_ax.get_ylim()[1] * 1.2))
    calls_ax.set_ylabel("gradient-bucket all-reduces")
    calls_ax.set_title("DDP's gradient all-reduces in each step's backward")
    calls_ax.legend(fontsize="small", loc="upper left")
    diff_ax.set_yscale("log")
    diff_ax.set_ylim(floor / 3, 100)
    diff_ax.set_ylabel("largest gradient difference\nbetween ranks (0 drawn at 1e-12)")
    diff_ax.set_title("After backward: gradients equal on every rank?")
    fig.suptitle(title or "Gradient synchronisation, step by step")
    return fig


def plot_rank_agreement(tel, step: int | None = None):
    """Two panels per parameter for a 2-rank run recorded with rec.watch_ddp(model): the
    gradient norms (each rank's before the all-reduce, the average after), and how alike
    the two ranks' gradients are (cosine similarity) before and after it.

    Before: the cosine comes from the three recorded norms, since for the average
    a = (g0 + g1) / 2, g0 . g1 = 2|a|^2 - (|g0|^2 + |g1|^2) / 2. After: 1 where both ranks
    recorded the same norm and first values (the same gradient), else left out."""
    import numpy as np

    from course_lib.plots.style import BLACK, BLUE, GREEN, ORANGE, new_figure

    if sorted(tel.ranks) != [0, 1]:
        raise ValueError(f"plot_rank_agreement() compares two ranks; this run has ranks "
                         f"{list(tel.ranks)}: launch it with world_size=2")
    step = int(tel.grads["step"].max()) if step is None else step
    rows = tel.grads.where(step=step)
    names = [n for _, n in sorted(set(zip(rows["index"].tolist(), rows["param"].tolist())))]

    def pick(rank: int, when: str, name: str) -> tuple[float, list[float]]:
        r = rows.where(rank=rank, when=when, param=name)
        return float(r["norm"][0]), list(r["values"][0])

    g0 = np.array([pick(0, "before", n)[0] for n in names])
    g1 = np.array([pick(1, "before", n)[0] for n in names])
    avg = np.array([pick(0, "after", n)[0] for n in names])
    cos_before = (2 * avg**2 - (g0**2 + g1**2) / 2) / (g0 * g1)
    same_after = [pick(0, "after", n) == pick(1, "after", n) for n in names]
    fig = new_figure(8.4, 7.0)  # at most JupyterLab's output width, so text is not shrunk
    norm_ax, cos_ax = fig.subplots(2, 1, sharex=True)
    x, w = np.arange(len(names)), 0.27
    norm_ax.bar(x - w, g0, w, label="rank 0, before", color=BLUE, edgecolor=BLACK)
    norm_ax.bar(x, g1, w, label="rank 1, before", color=ORANGE, hatch="//", edgecolor=BLACK)
    norm_ax.bar(x + w, avg, w, label="after (both ranks)", color=GREEN, hatch="..",
                edgecolor=BLACK)
    norm_ax.set_yscale("log")
    norm_ax.set_ylabel("gradient norm")
    norm_ax.set_title("Gradient norm per parameter")
    norm_ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    bars = cos_ax.bar(x - 0.2, cos_before, 0.4, label="before the all-reduce", color=ORANGE,
                      hatch="//", edgecolor=BLACK)
    cos_ax.bar_label(bars, [f"{c:.2f}" for c in cos_before], fontsize="small",
                     rotation=90, padding=3)  # upright labels would overlap their neighbours
    after = [1.0 if same else np.nan for same in same_after]
    bars = cos_ax.bar(x + 0.2, after, 0.4, label="after (identical = 1)", color=GREEN,
                      hatch="..", edgecolor=BLACK)
    cos_ax.bar_label(bars, ["1" if s else "differ" for s in same_after], fontsize="small")
    cos_ax.set_ylim(min(0.0, float(np.min(cos_before))) - 0.3, 1.15)  # room for the labels
    cos_ax.set_ylabel("cosine similarity,\nrank 0 vs rank 1")
    cos_ax.set_title("How alike are the two ranks' gradients?")
    cos_ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    cos_ax.set_xticks(x, names, rotation=30, ha="right", fontsize="small")
    fig.suptitle(f"Step {step}: each rank's own gradient before DDP's all-reduce,\n"
                 "the average after it")
    return fig
