"""Detector: evaluation over a DataLoader on every rank: samples DistributedSampler pads
counted twice (X1), and a metric printed from one rank's share without combining (X2)."""

from __future__ import annotations

import re

from course_lib.xray.detectors.passes import (
    SAME_SHARE,
    consumed,
    evaluating,
    grouped,
    in_all,
    loader_line,
    training,
)
from course_lib.xray.events import Collective, Pass, Print
from course_lib.xray.probes.collectives import OPS
from course_lib.xray.report import Finding, finding
from course_lib.xray.rules import rule
from course_lib.xray.run_events import RunEvents

COLLECTIVES_THAT_COMBINE = {name for name, op in OPS.items() if op.combines}
_METRIC = re.compile(r"\d\.\d|\d\s*%|\d\s*/\s*\d")  # 0.93, 93 %, 93/100: a measured value


def _no_evaluation_across_ranks(run: RunEvents) -> str:
    if run.world_size < 2:
        return "one rank only"
    if not any(evaluating(p) for _, p in run.of(Pass)):
        return "no evaluation loop over a DataLoader ran"
    return ""


# -- X1 and X2 ----------------------------------------------------------------------------------

def _eval_groups(groups: list[dict[int, Pass]]) -> list[dict[int, Pass]]:
    return [g for g in groups if all(evaluating(p) and p["done"] for p in g.values())]


def _combined_after(run: RunEvents, rank: int, start: float, end: float) -> list[Collective]:
    """The learner's collectives that combine values, on `rank` between two times."""
    return [e for r, e in run.of(Collective)
            if r == rank and start <= e["t"] <= end and e["op"] in COLLECTIVES_THAT_COMBINE]


@rule("X1", needs=(Pass, Collective), unjudged=_no_evaluation_across_ranks,
      absent="no evaluation summed or gathered across ranks counted a padded sample twice")
def _x1(run: RunEvents) -> Finding | None:
    for group in _eval_groups(grouped(run)):
        p = group[min(group)]
        settings, size = p["distributed"], p["dataset_len"]
        if not settings or not size or settings["total_size"] <= size:
            continue
        read = sum(len(consumed(q)) for q in group.values())
        extra = read - len({i for q in group.values() for i in consumed(q)})
        combined = _combined_after(run, min(group), p["t"], _window_end(run, min(group), p))
        if extra <= 0 or not combined:
            continue
        summed = any(e["op"] in ("all_reduce", "reduce") for e in combined)
        how = "summed them" if summed else "gathered them (a gather can drop the padding)"
        return finding("X1", f"in evaluation the {len(group)} ranks read {read} samples of a "
                             f"{size}-sample dataset and {how}: {extra} sample(s) counted "
                             f"twice (DistributedSampler pads each rank to "
                             f"{settings['total_size'] // settings['num_replicas']})",
                       loader_line(p), certainty="confirmed" if summed else "suspected")
    return None


def _window_end(run: RunEvents, rank: int, p: Pass) -> float:
    """When this evaluation's results were last in use on its rank: until the next training
    pass or the next pass of the same loader (else the end of the run). Other evaluation
    passes in between (imagenet's extra pass over the samples drop_last left out) add to
    the same numbers."""
    later = [e["t"] for r, e in run.of(Pass) if r == rank and e["t"] > p["t"]
             and (training(e) or e["loader"] == p["loader"])]
    return min(later, default=float("inf"))


@rule("X2", needs=(Pass, Print, Collective), unjudged=_no_evaluation_across_ranks,
      absent="no rank printed a metric from its share of an evaluation before a collective "
             "combined the ranks' results")
def _x2(run: RunEvents) -> Finding | None:
    for group in _eval_groups(grouped(run)):
        indices = [set(consumed(p)) for p in group.values()]
        if not all(indices) or in_all(indices) >= SAME_SHARE * min(map(len, indices)):
            continue  # each rank evaluated everything: its own number is the whole set's
        for rank in sorted(group):
            p = group[rank]
            end = _window_end(run, rank, p)
            left = p.get("stopped", p["end"])  # a print in the loop body is per batch
            prints = [e for r, e in run.of(Print) if r == rank and left < e["t"] < end
                      and _METRIC.search(e["text"])]
            if not prints or _combined_after(run, rank, p["t"], prints[0]["t"]):
                continue
            size = p["dataset_len"]
            of = f" of the {size} evaluation samples" if size else " of the evaluation samples"
            return finding("X2", f"rank {rank} printed {prints[0]['text'][:60]!r} after "
                                 f"evaluating {len(indices[rank])}{of}, with no collective "
                                 f"combining the ranks' results in between", prints[0]["where"])
    return None
