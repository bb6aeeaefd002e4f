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

The pictures of a Diagnosis (which GPU each rank chose) are in `placement_views`.

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
