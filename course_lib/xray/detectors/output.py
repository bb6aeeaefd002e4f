"""Detector: every rank printing the same log lines (P16), from the output probe."""

from __future__ import annotations

from collections import defaultdict

from course_lib.xray.observation import Observation
from course_lib.xray.report import Finding, finding

CHECKS = ["P16"]


def detect(obs: Observation) -> list[Finding]:
    """P16 when one print() line ran on every rank: confirmed when the ranks printed the
    same text, suspected when each printed its own values more than once."""
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
        if common:
            text = next(t for t in by_rank[0] if t in common)
            found.append(finding("P16", f"all {obs.world_size} ranks printed {text[:60]!r}: "
                                        f"{len(common)} identical line(s) from this print, "
                                        f"each once per rank", where))
        elif times >= 2:
            found.append(finding("P16", f"all {obs.world_size} ranks ran this print "
                                        f"{times} times or more, each with its own values "
                                        f"(rank 0: {by_rank[0][0][:40]!r})", where,
                                 certainty="suspected"))
    found.sort(key=lambda f: not f.confirmed)
    return found[:1]  # one finding: the first site that shows it best


def not_checked(obs: Observation) -> list[str]:
    if obs.world_size < 2:
        return ["P16: one rank only"]
    if len(obs.events) < obs.world_size:
        return ["P16: not every rank's output came back"]
    return []
