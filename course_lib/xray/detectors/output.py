"""Detector: every rank printing the same log lines (P16), from the output probe."""

from __future__ import annotations

import re
from collections import defaultdict

from course_lib.xray.events import Print
from course_lib.xray.report import Finding, finding
from course_lib.xray.rules import one_rank, rule
from course_lib.xray.run_events import RunEvents

_PER_RANK = re.compile(r"rank|gpu|device|cuda:|local", re.IGNORECASE)


def _not_every_rank(run: RunEvents) -> str:
    if one_rank(run) or len(run.ranks) >= run.world_size:
        return one_rank(run)
    return "not every rank's output came back"


@rule("P16", needs=(Print,), unjudged=_not_every_rank,
      absent="no print ran on every rank with the same text, nor again and again with each "
             "rank's own values without naming the rank")
def _p16(run: RunEvents) -> Finding | None:
    """P16 when one print() line ran on every rank and printed the same text, or printed
    its own values more than once without naming the rank (the first site that shows it)."""
    if _not_every_rank(run):
        return None
    sites: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for rank, e in run.of(Print):
        sites[e["where"]][rank].append(e["text"])
    for where, by_rank in sites.items():
        if len(by_rank) < run.world_size:
            continue
        common = set.intersection(*(set(texts) for texts in by_rank.values())) - {""}
        times = min(len(texts) for texts in by_rank.values())
        first = by_rank[min(by_rank)][0]
        if common:
            text = next(t for t in by_rank[min(by_rank)] if t in common)
            return finding("P16", f"{_every(run.world_size)} printed {text[:60]!r}: "
                                  f"{len(common)} identical line(s) from this print, "
                                  f"each once per rank", where)
        if times >= 2 and not _PER_RANK.search(first):
            # Each rank its own values, again and again: a log line repeated per rank. A line
            # that names the rank ("[GPU1] epoch 3") is a per-rank diagnostic, on purpose.
            return finding("P16", f"{_every(run.world_size)} ran this print "
                                  f"{times} time(s) each, each rank with its own values "
                                  f"(rank {min(by_rank)}: {first[:50]!r})", where)
    return None


def _every(n: int) -> str:
    return "both ranks" if n == 2 else f"all {n} ranks"
