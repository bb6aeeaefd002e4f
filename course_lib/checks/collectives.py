"""Which collectives the learner's code called on a rank, and on which tensors, so that a hint
can say what the answer did ("you broadcast a copy") rather than guess.

    with recorded() as calls:
        fn(model)
    touched(calls, "broadcast", [p for p in model.parameters()])  # did it reach them?

The recorder is the x-ray's (course_lib/xray/probes/collectives.py: its op table, and the
functions wrapped only while the block runs); here are the questions the checks ask of it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from course_lib.xray.probes.collectives import Call, recorded, storage_of

__all__ = ["Call", "count", "recorded", "storage_of", "touched"]


def count(calls: Iterable[Call], *ops: str) -> int:
    """How many of the calls were one of `ops` (any collective when none is named)."""
    return sum(1 for c in calls if not ops or c.op in ops)


def touched(calls: Iterable[Call], op: str, tensors: Iterable[torch.Tensor]) -> int:
    """How many of `tensors` an `op` call reached (through the tensor or a view of it)."""
    reached = {c.storage for c in calls if c.op == op}
    return sum(1 for t in tensors if storage_of(t) in reached)


def early_sync(where: str, other: int, synced_at: list[int], k: int, when: str) -> str | None:
    """The hint for ranks whose gradients differ because the one micro-batch whose forward
    ran outside no_sync() (`synced_at`, counted from 0) was not the last of `k`; None when it
    was the last (the cause is elsewhere). Lessons 07 and 09."""
    if not synced_at or synced_at[-1] == k - 1:
        return None
    after = synced_at[-1] + 1
    later = f"micro-batch {k}" if after + 1 == k else f"micro-batches {after + 1}-{k}"
    return (f"{where}rank 0's and rank {other}'s gradients differ {when}: your one all-reduce "
            f"came with micro-batch {after} of {k} (its forward ran outside no_sync()), and the "
            f"backwards of {later} stayed on each rank. The micro-batch outside no_sync() must "
            f"be the last one: its backward all-reduces the sum of all {k}.")
