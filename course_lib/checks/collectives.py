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
