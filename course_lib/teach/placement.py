"""Where is everything? Device placement, rank by rank.

On each rank, `snapshot()` notes the device of the model's parameters and buffers, of the
batch (inputs, targets) and of anything else named (a loss function with a weight, say),
plus the device the rank chose. Back in the notebook, `diagnose()` compares them: within a
rank, what is not on the rank's device; across ranks, accelerators shared by several ranks
and devices that do not match LOCAL_RANK.

    def where():
        ...
        return placement.snapshot(model, device=device, inputs=x, targets=y, loss_fn=loss_fn)

    diagnosis = placement.diagnose(launch(where).results)
    print(diagnosis)             # a table: one row per item, one column per rank
    diagnosis.problems           # what disagrees, in words ([] when all is well)

`device_map()` and `machines_map()` draw which GPU each rank chose, one machine or all of
them; `device_explorer()` redraws that for a device rule and a layout picked with widgets.

Everything is plain data (dicts, lists, strings), so it travels back from the ranks as is.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from course_lib.wrappers import unwrap

# Devices that several ranks may share without harm: every rank has "its own" CPU.
SHAREABLE = ("cpu", "meta")
WRONG = "✗"


def snapshot(model: nn.Module | None = None, *, device: Any = None, **named: Any) -> dict:
    """Where this rank's tensors are, as plain data (call it on every rank).

    model: its parameters and buffers are listed as "model parameters" / "model buffers"
    (a DistributedDataParallel wrapper is looked through). device: the device this rank
    chose to use. named: anything else by name: a tensor, a module (its parameters and
    buffers), or a list, tuple or dict of tensors (a batch).
    """
    items: list[dict] = []
    if model is not None:
        items.extend(_module_items("model", unwrap(model)))
    for name, value in named.items():
        if isinstance(value, nn.Module):
            items.extend(_module_items(name, value))
        else:
            items.append(_item(name, _tensors(value)))
    rank, local_rank, node = _who()
    return {"rank": rank, "local_rank": local_rank, "node": node,
            "device": None if device is None else str(torch.device(device)), "items": items}


@dataclass
class Diagnosis:
    """What diagnose() found. `problems` lists, in words, everything that disagrees."""

    snapshots: list[dict]
    expected: dict[int, str | None]  # rank -> the device its tensors should be on
    misplaced: list[tuple[int, str, str]] = field(default_factory=list)  # rank, item, devices
    split: list[tuple[int, str, str]] = field(default_factory=list)  # rank, item, devices
    shared: dict[str, list[int]] = field(default_factory=dict)  # "node 0 cuda:0" -> ranks
    not_local: list[tuple[int, str, int]] = field(default_factory=list)  # rank, device, LOCAL_RANK
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing disagrees."""
        return not self.problems

    @property
    def ranks(self) -> list[int]:
        return [s["rank"] for s in self.snapshots]

    def table(self) -> str:
        """One row per item, one column per rank; ✗ marks what is not where it should be."""
        names = _item_names(self.snapshots)
        cells = {(s["rank"], it["name"]): _describe(it["devices"]) for s in self.snapshots
                 for it in s["items"]}
        bad = {(r, name) for r, name, _ in self.misplaced + self.split}
        rows = [["", *(f"rank {r}" for r in self.ranks)]]
        if any(s["device"] for s in self.snapshots):
            rows.append(["device chosen", *(s["device"] or "-" for s in self.snapshots)])
        for name in names:
            rows.append([name, *(cells.get((r, name), "-") + (f" {WRONG}" if (r, name) in bad
                                                                 else "")
                                 for r in self.ranks)])
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        lines.append("")
        lines.extend(f"{WRONG} {p}" for p in self.problems)
        if not self.problems:
            lines.append("✔ every tensor is on its rank's device, and no two ranks share a GPU")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's display
        printer.text(self.table())


def diagnose(snapshots: Iterable[dict]) -> Diagnosis:
    """Compare every rank's snapshot: within a rank and across ranks."""
    snaps = sorted(snapshots, key=lambda s: s["rank"])
    diag = Diagnosis(snaps, {s["rank"]: _expected_device(s) for s in snaps})
    for s in snaps:
        _within_rank(diag, s)
    _within_rank_problems(diag)
    _across_ranks(diag, snaps)
    return diag


def device_map(diag: Diagnosis, gpus: int | None = None, node: int = 0) -> Any:
    """A bar per GPU of one machine: how many ranks use it (each GPU should carry one).

    gpus: how many GPUs the machine has (default: enough to show every device used)."""
    from course_lib.plots.style import new_figure

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
    from course_lib.plots.style import new_figure

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
    from functools import cache

    import ipywidgets as widgets
    from IPython.display import display

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
    from matplotlib.ticker import MaxNLocator

    from course_lib.plots.style import BLACK, BLUE, HIGHLIGHT

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


# -- on the rank -------------------------------------------------------------------------------

def _module_items(name: str, module: nn.Module) -> list[dict]:
    params = [p for p in module.parameters()]
    buffers = [b for b in module.buffers()]
    items = [_item(f"{name} parameters", params)] if params else []
    if buffers:
        items.append(_item(f"{name} buffers", buffers))
    if not items:  # a module with nothing to move, e.g. nn.CrossEntropyLoss()
        items.append({"name": name, "devices": {}, "count": 0})
    return items


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _item(name: str, tensors: list[torch.Tensor]) -> dict:
    counts = Counter(str(t.device) for t in tensors)
    return {"name": name, "devices": dict(sorted(counts.items())), "count": len(tensors)}


def _who() -> tuple[int, int, int]:
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    return rank, local_rank, int(os.environ.get("GROUP_RANK", 0))


# -- in the notebook ---------------------------------------------------------------------------

def _expected_device(s: dict) -> str | None:
    """The device a rank's tensors belong on: the one it chose, else its model's."""
    if s["device"]:
        return s["device"]
    model = [it for it in s["items"] if it["name"] == "model parameters"]
    if model and len(model[0]["devices"]) == 1:
        return next(iter(model[0]["devices"]))
    counts: Counter = Counter()
    for it in s["items"]:
        counts.update(it["devices"])
    return counts.most_common(1)[0][0] if counts else None


def _within_rank(diag: Diagnosis, s: dict) -> None:
    rank, want = s["rank"], diag.expected[s["rank"]]
    for it in s["items"]:
        devices = it["devices"]
        if len(devices) > 1:
            diag.split.append((rank, it["name"], _describe(devices)))
        elif devices and want and next(iter(devices)) != want:
            diag.misplaced.append((rank, it["name"], next(iter(devices))))


def _within_rank_problems(diag: Diagnosis) -> None:
    """One line per kind of problem, naming every rank that has it."""
    split: dict[tuple[str, str], list[int]] = {}
    for rank, name, where in diag.split:
        split.setdefault((name, where), []).append(rank)
    for (name, where), ranks in split.items():
        diag.problems.append(f"{_on(ranks)}: {name} are split over devices ({where})")
    misplaced: dict[tuple[str, str, str | None], list[int]] = {}
    for rank, name, where in diag.misplaced:
        misplaced.setdefault((name, where, diag.expected[rank]), []).append(rank)
    for (name, where, want), ranks in misplaced.items():
        diag.problems.append(f"{_on(ranks)}: {name} on {where}, not on the rank's device "
                             f"{want}: move them with .to(device), or, for a tensor a "
                             "model keeps, register_buffer it so that model.to() moves it")


def _across_ranks(diag: Diagnosis, snaps: list[dict]) -> None:
    by_device: dict[tuple[int, str], list[int]] = {}
    for s in snaps:
        dev = diag.expected[s["rank"]]
        if not dev or torch.device(dev).type in SHAREABLE:
            continue
        by_device.setdefault((s["node"], dev), []).append(s["rank"])
        index = torch.device(dev).index
        if index is not None and index != s["local_rank"]:
            diag.not_local.append((s["rank"], dev, s["local_rank"]))
    for (node, dev), ranks in by_device.items():
        if len(ranks) > 1:
            diag.shared[f"machine {node} {dev}"] = ranks
            diag.problems.append(f"ranks {_listing(ranks)} all use {dev} on machine {node}: "
                                 "each rank needs its own GPU")
    if diag.not_local:
        wrong = ", ".join(f"rank {r} uses {dev} (LOCAL_RANK {local})"
                          for r, dev, local in diag.not_local)
        diag.problems.append(f"not the LOCAL_RANK's GPU: {wrong}; use cuda:LOCAL_RANK")


def _item_names(snaps: list[dict]) -> list[str]:
    names: list[str] = []
    for s in snaps:
        names.extend(it["name"] for it in s["items"] if it["name"] not in names)
    return names


def _describe(devices: dict[str, int]) -> str:
    """'cpu', or 'cpu (2), meta (2)' when split; 'nothing' for an item without tensors."""
    if not devices:
        return "nothing"
    if len(devices) == 1:
        return next(iter(devices))
    return ", ".join(f"{d} ({n})" for d, n in devices.items())


def _on(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_listing(ranks)}"


def _listing(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))
