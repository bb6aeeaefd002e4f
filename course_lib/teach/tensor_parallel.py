"""Lesson 16's measurements on the ranks: which slice of a full parameter each rank holds,
the collectives a step issued (per layer, from torch's CommDebugMode; on the wire, from the
flight recorder) and the bytes autograd saves for backward. Each returns plain data that a
rank can send home; the pictures are in tensor_parallel_views.py."""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# How CommDebugMode names the functional collectives DTensor issues, in the words of
# torch.distributed (the flight recorder's "gloo:all_reduce" is read the same way).
_OP_NAMES = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
             "all_to_all_single": "all_to_all"}


def op_name(name: str) -> str:
    """'c10d_functional.all_gather_into_tensor' or 'gloo:all_gather' -> 'all_gather'."""
    short = name.split(".")[-1].split(":")[-1]
    return _OP_NAMES.get(short, short)


def local_bytes(t: torch.Tensor) -> int:
    """Bytes this rank holds for `t`: its local shard for a DTensor, else the tensor itself."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def shard_of(param: torch.Tensor) -> dict[str, Any]:
    """Where this rank's piece sits in the full parameter: the sharded dim (None when the
    rank holds all of it) and the [start, stop) range along it, torch.chunk's split, which is
    DTensor's Shard (1-D mesh)."""
    from torch.distributed.tensor import DTensor, Shard

    shape = tuple(param.shape)
    sharded = [p for p in param.placements if isinstance(p, Shard)] if isinstance(
        param, DTensor) else []
    if not isinstance(param, DTensor) or not sharded:
        return {"shape": shape, "dim": None, "start": 0, "stop": 0, "placement": "whole"}
    dim = sharded[0].dim % len(shape)
    mesh = param.device_mesh
    start = mesh.get_local_rank() * -(-shape[dim] // mesh.size())
    stop = start + param.to_local().shape[dim]
    return {"shape": shape, "dim": dim, "start": start, "stop": stop,
            "placement": str(param.placements[0])}


def shards(model: nn.Module) -> dict[str, dict[str, Any]]:
    """shard_of() for each weight of the model (biases left out: they follow their weight)."""
    return {name: shard_of(p) for name, p in model.named_parameters() if name.endswith("weight")}


def flight_records() -> list[dict[str, Any]]:
    """This rank's flight-recorder entries (torch 2.13 records every gloo collective)."""
    dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())  # type: ignore[attr-defined]
    return list(dump.get("entries", []))


@dataclass
class Collectives:
    """What `counted()` saw: per layer and pass, how many of each collective torch's
    CommDebugMode counted; and the flight recorder's entries of the same span (op, input
    shapes, bytes), which is what gloo ran."""

    per_layer: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    wire: list[dict[str, Any]] = field(default_factory=list)

    def total(self, passes: tuple[str, ...] = ("forward", "backward")) -> int:
        """Collectives of the whole model in these passes (CommDebugMode's 'Global' row)."""
        row = self.per_layer.get("Global", {})
        return sum(n for p in passes for n in row.get(p, {}).values())

    def layers(self) -> dict[str, dict[str, dict[str, int]]]:
        """Only the leaf layers that issued a collective (not their parents, nor the whole
        model, nor 'Global')."""
        names = [n for n in self.per_layer if n not in ("Global", "(model)")]
        leaves = [n for n in names if not any(o.startswith(n + ".") for o in names)]
        return {n: self.per_layer[n] for n in leaves}


@contextlib.contextmanager
def counted(model: nn.Module) -> Iterator[Collectives]:
    """Count the collectives issued inside the block, per layer of `model` (its own names,
    'blocks.0.down', in the model's order), forward and backward apart."""
    from torch.distributed.tensor.debug import CommDebugMode

    seen = Collectives()
    first = max((e["record_id"] for e in flight_records()), default=-1)
    mode = CommDebugMode()
    with mode:
        yield seen
    counts = mode.comm_module_counts  # keyed 'Global', 'TinyLM', 'TinyLM.blocks.0.down', ...
    root = type(model).__name__
    names = [("Global", "Global")] + [(name, f"{root}.{name}" if name else root)
                                      for name, _ in model.named_modules()]
    for name, key in names:
        if key in counts:
            seen.per_layer[name or "(model)"] = {p: {op_name(str(op)): n for op, n in ops.items()
                                                     if n} for p, ops in counts[key].items()}
    seen.wire = [_wire(e) for e in flight_records() if e["record_id"] > first]


def _wire(entry: dict[str, Any]) -> dict[str, Any]:
    sizes = [tuple(s) for s in entry.get("input_sizes") or []]
    itemsize = {"Float": 4, "Double": 8, "Long": 8, "Int": 4, "BFloat16": 2, "Half": 2}
    dtypes = entry.get("input_dtypes") or []
    nbytes = sum(int(torch.Size(s).numel()) * itemsize.get(d, 4) for s, d in zip(sizes, dtypes))
    return {"op": op_name(entry["profiling_name"]), "sizes": sizes, "bytes": nbytes}


@contextlib.contextmanager
def saved_bytes() -> Iterator[dict[str, int]]:
    """Bytes of the tensors autograd saves for backward inside the block (a DTensor counts
    its local shard), in `counter["saved"]`. Parameters count too (a Linear saves its
    weight); for the activations alone, compare two runs of the same model."""
    counter = {"saved": 0}
    seen: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        local = t.to_local() if hasattr(t, "to_local") else t
        key = local.untyped_storage().data_ptr()
        if key not in seen:  # a storage saved twice (a view and its base) is held once
            seen.add(key)
            counter["saved"] += local.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield counter
