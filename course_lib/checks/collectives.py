"""Which collectives the learner's code called on a rank, and on which tensors, so that a hint
can say what the answer did ("you broadcast a copy") rather than guess.

    with recorded() as calls:
        fn(model)
    touched(calls, "broadcast", [p for p in model.parameters()])  # did it reach them?

Only the rank process is patched, and only while the block runs: `dist.<op>` looked up at
call time (as `dist.all_reduce(...)` does) goes through the recorder.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

# The collectives a learner may reach for, with the name of their tensor argument.
OPS = {"all_reduce": "tensor", "broadcast": "tensor", "reduce": "tensor",
       "all_gather": "tensor", "all_gather_into_tensor": "input_tensor",
       "reduce_scatter_tensor": "input", "all_gather_object": "obj",
       "broadcast_object_list": "object_list", "scatter": "tensor", "gather": "tensor",
       "send": "tensor", "recv": "tensor", "barrier": ""}


@dataclass(frozen=True)
class Call:
    """One collective call: its name, and the storage of its tensor argument (0 if none)."""

    op: str
    storage: int


@contextmanager
def recorded() -> Iterator[list[Call]]:
    """Record every collective of OPS called inside the block, in order."""
    calls: list[Call] = []
    originals = {op: getattr(dist, op) for op in OPS}
    for op, original in originals.items():
        setattr(dist, op, _recording(op, original, calls))
    try:
        yield calls
    finally:
        for op, original in originals.items():
            setattr(dist, op, original)


def _recording(op: str, original, calls: list[Call]):
    def call(*args, **kwargs):
        tensor = args[1] if op == "all_gather" and len(args) > 1 else (
            args[0] if args else kwargs.get(OPS[op]))
        calls.append(Call(op, storage_of(tensor)))
        return original(*args, **kwargs)
    call.__wrapped__ = original
    return call


def storage_of(value: object) -> int:
    """The address of a tensor's storage (views share it with their base); 0 for others."""
    if isinstance(value, torch.Tensor):
        return value.untyped_storage().data_ptr()
    return 0


def count(calls: Iterable[Call], *ops: str) -> int:
    """How many of the calls were one of `ops` (any collective when none is named)."""
    return sum(1 for c in calls if not ops or c.op in ops)


def touched(calls: Iterable[Call], op: str, tensors: Iterable[torch.Tensor]) -> int:
    """How many of `tensors` an `op` call reached (through the tensor or a view of it)."""
    reached = {c.storage for c in calls if c.op == op}
    return sum(1 for t in tensors if storage_of(t) in reached)
