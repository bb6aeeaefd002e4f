"""Pictures of a placement Diagnosis (course_lib.teach.placement): which GPU each rank
chose, on one machine (`device_map`) or all of them (`machines_map`), and an explorer that
redraws it for a device rule and a layout picked with widgets (`device_explorer`). Lesson 02.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import ipywidgets as widgets
import torch
from IPython.display import display
from matplotlib.ticker import MaxNLocator

from course_lib.plots.style import BLACK, BLUE, HIGHLIGHT, new_figure
from course_lib.teach.placement import SHAREABLE, Diagnosis


def device_map(diag: Diagnosis, gpus: int | None = None, node: int = 0) -> Any:
    """A bar per GPU of one machine: how many ranks use it (each GPU should carry one).

    gpus: how many GPUs the machine has (default: enough to show every device used)."""
    users = _gpu_users(diag, node)
    if not users and not gpus:
        raise ValueError("device_map(): no rank uses a GPU in these snapshots")
    count = max([gpus or 0, *(i + 1 for i in users)])
    fig = new_figure(1.6 + 1.3 * count, 3.4)
    _draw_machine(fig.subplots(), users, gpus or count, count)
    fig.axes[0].set_title(f"Which GPU each rank chose (machine {node})\n"
                          "Healthy: one rank per GPU (dotted line)", fontsize="medium")
    return fig


def machines_map(diag: Diagnosis, gpus: int) -> Any:
    """device_map for every machine of the job side by side, each with `gpus` GPUs; a GPU
    number the machine does not have gets a crossed bar."""
    nodes = sorted({s["node"] for s in diag.snapshots})
    users = {node: _gpu_users(diag, node) for node in nodes}
    count = max([gpus, *(i + 1 for u in users.values() for i in u)])
    fig = new_figure(min(14.0, 1.2 + (0.8 * count + 0.6) * len(nodes)), 3.6)
    axes = fig.subplots(1, len(nodes), sharey=True, squeeze=False)[0]
    for ax, node in zip(axes, nodes):
        _draw_machine(ax, users[node], gpus, count)
        ax.set_title(f"machine {node} ({gpus} GPUs)", fontsize="medium")
    fig.suptitle("Which GPU each rank chose. Healthy: one rank per GPU (dotted line)",
                 fontsize="medium")
    return fig


def device_explorer(run: Any, rules: list[str]) -> Any:
    """machines_map for a device rule, a number of machines and GPUs per machine.

    run(rule, machines, gpus) launches the ranks and returns their Diagnosis; each setting
    runs once, so going back to one redraws at once. The default setting's figure and table
    are displayed first, for viewers without widgets."""
    cached = cache(run)
    rule = widgets.Dropdown(options=rules, value=rules[min(1, len(rules) - 1)],
                            description="device")
    machines = widgets.IntSlider(2, 1, 2, description="machines")
    gpus = widgets.IntSlider(2, 2, 4, description="GPUs each")

    def show() -> None:
        diag = cached(rule.value, machines.value, gpus.value)
        display(machines_map(diag, gpus.value))
        print(diag)

    show()
    out = widgets.Output()

    def redraw(_: object = None) -> None:
        with out:
            out.clear_output(wait=True)
            show()

    for control in (rule, machines, gpus):
        control.observe(redraw, "value")
    return widgets.VBox([widgets.HBox([rule, machines, gpus]), out])


def _gpu_users(diag: Diagnosis, node: int) -> dict[int, list[int]]:
    """GPU index -> the ranks of machine `node` whose device is that GPU."""
    users: dict[int, list[int]] = {}
    for s in diag.snapshots:
        dev = diag.expected[s["rank"]]
        if s["node"] == node and dev and torch.device(dev).type not in SHAREABLE:
            users.setdefault(torch.device(dev).index or 0, []).append(s["rank"])
    return users


def _draw_machine(ax: Any, users: dict[int, list[int]], gpus: int, count: int) -> None:
    """One bar per GPU index 0..count-1: the ranks on it; indices >= gpus do not exist."""
    for i in range(count):
        ranks = users.get(i, [])
        missing = i >= gpus
        bad = missing or len(ranks) > 1
        bar = ax.bar(i, len(ranks), width=0.6, color=HIGHLIGHT if bad else BLUE,
                     edgecolor=BLACK, hatch="xx" if missing else "//" if bad else "")
        label = ("ranks " if len(ranks) > 1 else "rank ") + ", ".join(map(str, ranks))
        if missing:
            label = f"no such GPU:\n{label}" if ranks else "no such GPU"
        ax.bar_label(bar, [label if ranks or missing else "idle"], fontsize="small")
    ax.axhline(1, color=BLACK, linestyle=":", lw=1)
    ax.set_xticks(range(count), [f"cuda:{i}" for i in range(count)])
    ax.set_ylim(0, max(2, *(len(r) for r in users.values())) + 0.9)
    ax.set_ylabel("ranks using this GPU")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
