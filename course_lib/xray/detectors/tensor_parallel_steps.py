"""Detector: what a tensor-parallel group's ranks compute in a training step: different
dropout masks on an activation the group holds alike (TP5), and clip_grad_norm_ over DTensor
and plain parameters (TP9). Its groups and seeds are read as tensor_parallel.py reads them.
"""

from __future__ import annotations

from collections import defaultdict

from course_lib.xray.cause import learner_frame
from course_lib.xray.detectors.tensor_parallel import (
    first_plans,
    in_parens,
    no_group,
    seeds_in_words,
    tp_groups,
)
from course_lib.xray.events import Seed, TpDropout, TpPlan
from course_lib.xray.report import Finding, finding
from course_lib.xray.rules import rule
from course_lib.xray.run_events import RunEvents

# -- TP5 ----------------------------------------------------------------------------------------

def _no_dropout(run: RunEvents) -> str:
    if no_group(run):
        return no_group(run)
    return "" if run.of(TpDropout) else "no dropout ran in training after parallelize_module"


@rule("TP5", needs=(TpPlan, TpDropout, Seed), unjudged=_no_dropout,
      absent="no dropout drew different masks on the ranks of one tensor-parallel group for "
             "an activation they held alike")
def _tp5(run: RunEvents) -> Finding | None:
    """A dropout whose input was the same on the ranks of one group (a replicated
    activation, outside the sharded layers) while their random generators differed: each
    rank dropped other units of one activation. Inside the sharded layers each rank's slice
    differs, and so may its mask."""
    calls: dict[tuple[str, int], dict[int, TpDropout]] = defaultdict(dict)
    for rank, e in run.of(TpDropout):
        calls[(e["where"], e["number"])][rank] = e
    plans = first_plans(run)
    for group in sorted({g for g in tp_groups(run).values() if len(g) >= 2}):
        for by_rank in sorted(calls.values(), key=lambda c: min(e["t"] for e in c.values())):
            if any(r not in by_rank for r in group) or group[0] not in plans:
                continue
            first = by_rank[group[0]]
            for r in group[1:]:
                e = by_rank[r]
                if e["fingerprint"] == first["fingerprint"] and e["rng"] != first["rng"]:
                    return _tp5_finding(run, plans[group[0]], group[0], r, first, e)
    return None


def _tp5_finding(run: RunEvents, plan: TpPlan, a: int, b: int, ea: TpDropout,
                 eb: TpDropout) -> Finding:
    seeded, where = seeds_in_words(run, (a, ea["t"]), (b, eb["t"]))
    return finding("TP5", f"ranks {a} and {b}, one tensor-parallel group (parallelize_module at "
                          f"{plan['where']}), drew different masks in the dropout at "
                          f"{ea['where']} (p={ea['p']:g}): its input was the same on both (an "
                          f"activation every rank of the group holds whole), their random "
                          f"generators were not{in_parens(seeded)}; outside the sharded layers "
                          "every rank of the group must draw the same mask: seed them alike "
                          "(a per-replica seed from the data-parallel rank)", where or ea["where"])


# -- TP9 ----------------------------------------------------------------------------------------

MIXED = "got mixed torch.Tensor and DTensor"  # DTensor's dispatcher (tensor/_dispatch.py)


@rule("TP9", needs=(TpPlan,), unjudged=no_group,
      absent="no clip_grad_norm_ over DTensor and plain parameters failed")
def _tp9(run: RunEvents) -> Finding | None:
    """clip_grad_norm_ raised DTensor's "got mixed torch.Tensor and DTensor": a partly
    parallelized model's parameters are DTensors (the plan's) and plain tensors."""
    if run.error is None:
        return None
    plans = first_plans(run)
    for f in run.error.failures:
        if MIXED not in f.message or "clip_grad" not in f.traceback:
            continue
        frame = learner_frame(f)
        at = f" at {frame.where}" + (f" ({frame.source})" if frame.source else "") \
            if frame else ""
        plan = plans.get(f.rank) or next(iter(plans.values()), None)
        by = f" (parallelize_module at {plan['where']})" if plan else ""
        return finding("TP9", f"rank {f.rank} raised {f.error_type or 'an error'}{at}: "
                              f"'...{MIXED}': the model's parameters are DTensors where the "
                              f"plan sharded them{by} and plain tensors elsewhere; call "
                              "clip_grad_norm_ inside torch.distributed.tensor.experimental."
                              "implicit_replication(), which treats the plain ones as "
                              "replicated", frame.where if frame else "")
    return None
