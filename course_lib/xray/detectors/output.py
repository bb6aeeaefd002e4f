"""Detector: every rank printing the same log lines (P16), from the output probe."""

from __future__ import annotations

import re
from collections import defaultdict

from course_lib.xray.observation import Observation
from course_lib.xray.report import Finding, finding

CHECKS = ["P16"]
_PER_RANK = re.compile(r"rank|gpu|device|cuda:|local", re.IGNORECASE)


def detect(obs: Observation) -> list[Finding]:
    """P16 when one print() line ran on every rank and printed the same text, or printed
    its own values more than once without naming the rank."""
    if obs.world_size < 2 or len(obs.events) < obs.world_size:
        return []
    sites: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for rank, e in obs.of("print"):
        sites[e["where"]][rank].append(e["text"])
    found = []
    for where, by_rank in sites.items():
        if len(by_rank) < obs.world_size:
            continue
        common = set.intersection(*(set(texts) for texts in by_rank.values())) - {""}
        times = min(len(texts) for texts in by_rank.values())
        first = by_rank[min(by_rank)][0]
        if common:
            text = next(t for t in by_rank[min(by_rank)] if t in common)
            found.append(finding("P16", f"{_every(obs.world_size)} printed {text[:60]!r}: "
                                        f"{len(common)} identical line(s) from this print, "
                                        f"each once per rank", where))
        elif times >= 2 and not _PER_RANK.search(first):
            # Each rank its own values, again and again: a log line repeated per rank. A line
            # that names the rank ("[GPU1] epoch 3") is a per-rank diagnostic, on purpose.
            found.append(finding("P16", f"{_every(obs.world_size)} ran this print "
                                        f"{times} time(s) each, each rank with its own values "
                                        f"(rank {min(by_rank)}: {first[:50]!r})", where))
    return found[:1]  # one finding: the first site that shows it


def _every(n: int) -> str:
    return "both ranks" if n == 2 else f"all {n} ranks"


def not_checked(obs: Observation) -> list[str]:
    if obs.world_size < 2:
        return ["P16: one rank only"]
    if len(obs.events) < obs.world_size:
        return ["P16: not every rank's output came back"]
    return []
