"""DDP's gradient buckets, seen from a real run: when backward computes the last gradient
against when it returns, and how the rebuilt buckets depend on `bucket_cap_mb`.

    timed_backward(rec, model, loss)      # instead of loss.backward() inside rec.step()
    plot_bucket_layouts(layouts)          # every cap of a run, one row each
    bucket_explorer(layouts)              # the same, one cap at a time, with a slider
"""

from __future__ import annotations

from typing import Any

from torch import nn

from course_lib import devices
from course_lib.telemetry.clock import now

MIB = 2**20
# DDP's first rebuilt bucket when bucket_cap_mb is not set (dist._DEFAULT_FIRST_BUCKET_BYTES,
# a private constant); drawn as a mark, never used to compute what a run did.
DEFAULT_FIRST_BUCKET_MB = 1.0


def timed_backward(rec: Any, model: nn.Module, loss: Any) -> None:
    """loss.backward(), recorded as two spans: "backward" until the last parameter's
    gradient is computed, then "wait for all-reduce" until backward returns. On a GPU, the
    edges wait for the queued work, and each gradient's time is a CUDA event where it was
    accumulated (devices.timestamp), so the spans show when the work ran."""
    ready: list[Any] = []
    handles = [p.register_post_accumulate_grad_hook(
                   lambda _: ready.append(devices.timestamp(now)))
               for p in model.parameters() if p.requires_grad]
    devices.wait_for_gpu()
    start = now()
    try:
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    devices.wait_for_gpu()
    end = now()
    last = max(map(float, ready), default=end)
    rec.record_row("spans", rec.current_step, "backward", start, last)
    rec.record_row("spans", rec.current_step, "wait for all-reduce", last, end)


def _label(cap: Any) -> str:
    return "default (not set)" if cap is None else f"{cap:g} MB"


def _draw_layout(ax: Any, y: float, sizes: list[int], calls: int) -> None:
    """One row of stacked segments, one per rebuilt bucket, labelled with its size."""
    from course_lib.plots.style import BLACK, ORANGE, SKY

    left = 0.0
    for i, size in enumerate(sizes):
        mb = size / MIB  # neighbouring buckets alternate colour and hatch
        bar = ax.barh(y, mb, left=left, color=(SKY, ORANGE)[i % 2], hatch=("", "//")[i % 2],
                      edgecolor=BLACK, height=0.6)
        if mb > 0.6:
            ax.bar_label(bar, [f"{mb:.2f}"], label_type="center", fontsize="small")
        left += mb
    ax.text(left + 0.15, y, f"{calls} all-reduce{'s' if calls != 1 else ''} per step",
            va="center", fontsize="small")


def plot_bucket_layouts(layouts: dict[Any, dict[str, Any]]):
    """One row per cap: the rebuilt buckets DDP all-reduces in every step after the first.

    layouts: {cap in MB, or None for "not set": {"buckets": [bytes, ...] (DDP's
    rebuilt_bucket_sizes), "calls": [all-reduces in step 0, 1, ...]}}, from one run."""
    from course_lib.plots.style import new_figure

    caps = list(layouts)
    fig = new_figure(8.4, 1.0 + 0.55 * len(caps))
    ax = fig.subplots()
    for row, cap in enumerate(caps):
        _draw_layout(ax, -row, layouts[cap]["buckets"], layouts[cap]["calls"][-1])
    ax.set_yticks([-r for r in range(len(caps))], [_label(c) for c in caps])
    total = max(sum(v["buckets"]) for v in layouts.values()) / MIB
    ax.set_xlim(0, total * 1.35)
    ax.set_xlabel("MB of gradients, in the order backward produces them (segment = bucket)")
    ax.set_ylabel("bucket_cap_mb")
    ax.set_title("The rebuilt buckets for each cap (this run, after step 0)")
    return fig


def plot_bucket_layout(layouts: dict[Any, dict[str, Any]], cap: Any):
    """One cap of plot_bucket_layouts(), with the first bucket's cap drawn as a line (the cap
    itself, or 1 MiB when bucket_cap_mb is not set)."""
    from course_lib.plots.style import HIGHLIGHT, new_figure

    if cap not in layouts:
        raise ValueError(f"no run with bucket_cap_mb={cap!r}; this run has {list(layouts)}")
    sizes, calls = layouts[cap]["buckets"], layouts[cap]["calls"]
    fig = new_figure(8.4, 2.4)
    ax = fig.subplots()
    _draw_layout(ax, 0, sizes, calls[-1])
    limit = DEFAULT_FIRST_BUCKET_MB if cap is None else cap
    ax.axvline(limit, color=HIGHLIGHT, ls="--", lw=1.5)
    note = (f" not set: first bucket {limit:g} MiB, the others 25 MB" if cap is None
            else f" cap: {limit:g} MB per bucket")
    ax.text(limit, 0.45, note, color=HIGHLIGHT, fontsize="small")
    ax.set_yticks([])
    ax.set_xlim(0, sum(sizes) / MIB * 1.35)
    ax.set_ylim(-0.6, 0.7)
    ax.set_xlabel("MB of gradients (segment = bucket)")
    ax.set_title(f"bucket_cap_mb = {_label(cap)}: all-reduces in steps 0, 1, 2... = "
                 f"{calls}")
    return fig


def bucket_explorer(layouts: dict[Any, dict[str, Any]]):
    """plot_bucket_layouts(layouts), then a slider over the caps that redraws one of them
    from the same run's data (no new run: moving the slider is instant)."""
    import ipywidgets as widgets
    from IPython.display import display

    from course_lib.plots.explore import redrawn_below

    display(plot_bucket_layouts(layouts))
    caps = {_label(c): c for c in layouts}  # labels as values: None is not a slider value
    slider = widgets.SelectionSlider(options=list(caps),
                                     description="bucket_cap_mb",
                                     style={"description_width": "initial"},
                                     layout=widgets.Layout(width="420px"))

    def draw():
        return plot_bucket_layout(layouts, caps[slider.value])

    display(draw())
    return widgets.VBox([slider, redrawn_below(draw, slider)])
