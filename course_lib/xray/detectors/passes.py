"""The data probe's passes, lined up across ranks: what the data and evaluation rules read.

A pass is one loop over a DataLoader on one rank (events.Pass); passes of the same loader
and number on every rank form a group.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from course_lib.xray.events import Pass
from course_lib.xray.run_events import RunEvents

SAME_SHARE = 0.5  # ranks that share at least this fraction of their samples read the same data


def grouped(run: RunEvents) -> list[dict[int, Pass]]:
    """Passes by (loader, pass number), each a dict rank -> pass, every rank present."""
    by_key: dict[tuple[str, int], dict[int, Pass]] = defaultdict(dict)
    for rank, p in run.of(Pass):
        by_key[(p["loader"], p["number"])][rank] = p
    return [g for g in by_key.values() if len(g) == run.world_size >= 2]


def training(p: Pass) -> bool:
    """A pass during which backward ran."""
    return p["backward"] > 0


def evaluating(p: Pass) -> bool:
    """A pass that read batches and ran no backward."""
    return p["backward"] == 0 and bool(p["sizes"])


def consumed(p: Pass) -> list[Any]:
    """The indices of the batches the loop took (a worker may have fetched more)."""
    return [i for batch in p["indices"][:len(p["sizes"])] for i in batch]


def samples(p: Pass) -> list[float]:
    """One fingerprint per sample read, in order."""
    return [v for batch in p["fingerprints"] for v in batch]


def loader_line(p: Pass) -> str:
    """Where the pass's DataLoader was made."""
    return p["loader"].rsplit("#", 1)[0]


def in_all(sets: list[set[Any]]) -> int:
    """How many items every set holds."""
    return len(set.intersection(*sets))


def epoch(p: Pass) -> str:
    """"epoch 2", or "the first epoch"."""
    return f"epoch {p['number']}" if p["number"] else "the first epoch"
