"""Detector: the model and its gradient sync: BatchNorm with small per-rank batches (P05),
replicas that differ although their gradients were averaged (P08), an all-reduce in every
accumulation micro-step (P09), find_unused_parameters and unused parameters (P10)."""

from __future__ import annotations

import math
from collections import defaultdict

from course_lib.xray.events import BatchNorm, Ddp, DdpUnused, OptStep
from course_lib.xray.report import Finding, finding
from course_lib.xray.rules import one_rank, rule
from course_lib.xray.run_events import RunEvents

SMALL_BATCH = 16  # per-rank BatchNorm batches up to this size give noisy statistics
GRADS_EQUAL = 1e-6  # relative: gradients averaged across ranks are equal on every rank
PARAMS_DIFFER = 1e-5  # relative: replicas whose checksums differ more than this differ
UNUSED_ERROR = ("Expected to have finished reduction in the prior iteration",
                "parameters that were not used in producing loss")


def _no_step(run: RunEvents) -> str:
    return one_rank(run) or ("" if run.of(OptStep) else "no optimizer step ran")


def _no_ddp_step(run: RunEvents) -> str:
    if not one_rank(run) and not run.of(Ddp):
        return "the model was not wrapped in DistributedDataParallel"
    return _no_step(run)


@rule("P05", needs=(BatchNorm, Ddp), unjudged=one_rank,
      absent=f"no plain BatchNorm layer trained only on batches of {SMALL_BATCH} or fewer "
             "samples per rank")
def _p05(run: RunEvents) -> Finding | None:
    """Plain BatchNorm layers that normalised training batches of few samples per rank;
    the fix goes where the model is wrapped in DDP (else where the layer ran)."""
    if one_rank(run):
        return None
    largest: dict[tuple[int, str], int] = {}
    first: dict[tuple[int, str], BatchNorm] = {}
    for rank, e in run.of(BatchNorm):
        key = (rank, e["layer"] or f"{e['cls']}@{e['layer_id']}")
        largest[key] = max(largest.get(key, 0), e["batch"])
        first.setdefault(key, e)
    small = {k: b for k, b in largest.items() if b <= SMALL_BATCH}
    if not small:
        return None
    rank = min(r for r, _ in small)
    keys = [k for k in small if k[0] == rank]
    names = sorted({first[k]["layer"] or first[k]["cls"] for k in keys})
    cls = first[keys[0]]["cls"]
    shown = ", ".join(repr(n) for n in names[:3]) + (
        f" and {len(names) - 3} more" if len(names) > 3 else "")
    batch = max(small[k] for k in keys)
    wrapped = [e["where"] for r, e in run.of(Ddp) if r == rank and e["batchnorm"]]
    fix = ("; convert them with nn.SyncBatchNorm.convert_sync_batchnorm(model) before "
           "this DDP(...)" if wrapped else "")
    return finding("P05", f"{cls} layer(s) {shown} normalised every training step with the "
                          f"statistics of at most {batch} samples on rank {rank} "
                          f"({run.world_size} ranks, each its own batch; no SyncBatchNorm)"
                          f"{fix}", wrapped[0] if wrapped else first[keys[0]]["where"])


def _steps(run: RunEvents) -> dict[int, list[OptStep]]:
    by_rank: dict[int, list[OptStep]] = defaultdict(list)
    for rank, e in run.of(OptStep):
        by_rank[rank].append(e)
    return by_rank


def _differ(a: list[float], b: list[float], tolerance: float) -> bool:
    return any(not math.isclose(x, y, rel_tol=tolerance, abs_tol=1e-12) for x, y in zip(a, b))


@rule("P08", needs=(OptStep,), unjudged=_no_step,
      absent="no replicas differed after a sampled optimizer step that averaged their gradients")
def _p08(run: RunEvents) -> Finding | None:
    """At one step, some parameters' gradients equal on every rank (averaged: the ranks do
    sync) while some parameters differ across ranks: replicas that drifted apart."""
    if one_rank(run):
        return None
    table: dict[tuple[str, int], dict[int, OptStep]] = defaultdict(dict)
    for rank, e in run.of(OptStep):
        if "grads" in e and "params" in e:
            table[(e["opt"], e["step"])][rank] = e
    for (_, step), by_rank in sorted(table.items(), key=lambda kv: kv[0][1]):
        if len(by_rank) < 2 or len({e["shapes"] for e in by_rank.values()}) > 1:
            continue
        ranks = sorted(by_rank)
        e0 = by_rank[ranks[0]]
        for other in ranks[1:]:
            e1 = by_rank[other]
            synced = [i for i, (a, b) in enumerate(zip(e0["grads"], e1["grads"]))
                      if a != [0.0, 0.0] and not _differ(a, b, GRADS_EQUAL)]
            apart = [i for i, (a, b) in enumerate(zip(e0["params"], e1["params"]))
                     if _differ(a, b, PARAMS_DIFFER)]
            if synced and apart:
                return finding("P08", _p08_evidence(step, ranks[0], other, e0, e1, synced,
                                                    apart), e0["where"])
    return None


def _p08_evidence(step: int, r0: int, r1: int, e0: OptStep, e1: OptStep,
                  synced: list[int], apart: list[int]) -> str:
    """One line: how many parameters were averaged, how many differ, by how much."""
    n, first = len(e0["params"]), apart[0]
    a, b = e0["params"][first][1], e1["params"][first][1]
    b0, b1 = e0.get("params_before"), e1.get("params_before")
    before = ("; they differed already before the first step"
              if b0 is not None and b1 is not None
              and any(_differ(x, y, PARAMS_DIFFER) for x, y in zip(b0, b1)) else "")
    return (f"after optimizer step {step}, {len(synced)} of {n} parameters had identical "
            f"(averaged) gradients on ranks {r0} and {r1}, but {len(apart)} of {n} "
            f"parameters differ between them (parameter #{first}: sum of squares "
            f"{a:.6g} on rank {r0}, {b:.6g} on rank {r1}){before}")


@rule("P09", needs=(OptStep, Ddp), unjudged=_no_ddp_step,
      absent="no all-reduce in every accumulation micro-step (most optimizer steps applied "
             "one all-reducing DDP backward)")
def _p09(run: RunEvents) -> Finding | None:
    """More than one gradient all-reduce (a synced DDP backward) accumulated into the
    gradients of one optimizer step (counted since the step's zero_grad)."""
    if one_rank(run):
        return None
    for rank, steps in sorted(_steps(run).items()):
        with_ddp = [e for e in steps if e["synced"] + e["local"] > 0]
        extra = [e for e in with_ddp if e["accumulated"] > 1]
        if not with_ddp or len(extra) * 2 < len(with_ddp):
            continue
        synced = sum(e["synced"] for e in with_ddp)
        local = sum(e["local"] for e in with_ddp)
        per_step = max(e["accumulated"] for e in with_ddp)
        entered = sum(e["no_sync"] for e in with_ddp)
        if local:
            held = f"no_sync() held back only {local}"
        elif entered:
            held = (f"no_sync() was entered {entered} times, but the forward ran outside it, "
                    f"so each backward still all-reduced")
        else:
            held = "none ran inside no_sync()"
        return finding("P09", f"on rank {rank}, {synced} backward passes all-reduced the "
                              f"gradients for {len(with_ddp)} optimizer steps (up to "
                              f"{per_step} accumulated per step); {held}",
                       extra[0].get("forward_at") or extra[0]["where"])
    return None


@rule("P10", needs=(Ddp, DdpUnused, OptStep), unjudged=_no_ddp_step,
      absent="no parameter went without a gradient in a DDP backward (without "
             "find_unused_parameters=True), and no needless find_unused_parameters=True")
def _p10(run: RunEvents) -> Finding | None:
    """Unused parameters without find_unused_parameters (the error, or suspected before it
    came), or find_unused_parameters=True with every parameter used in every backward."""
    models = run.of(Ddp)
    if one_rank(run) or not models:
        return None
    ddp = models[0][1]
    unused = run.of(DdpUnused)
    failed = _error_text(run)
    if unused and not ddp["find_unused"] and not ddp["static_graph"]:
        rank, e = unused[0]
        names = ", ".join(e["names"]) + (" ..." if e["count"] > len(e["names"]) else "")
        said = next((m for m in UNUSED_ERROR if m in failed), "")
        then = (f"; the next iteration failed: {said!r}" if said else
                "; without find_unused_parameters=True the next iteration fails")
        return finding("P10", f"{e['count']} of {e['of']} parameters ({names}) got no "
                              f"gradient in a backward on rank {rank}{then}", ddp["where"],
                       certainty="confirmed" if said else "suspected")
    if any(m in failed for m in UNUSED_ERROR):
        return finding("P10", f"DDP failed: {UNUSED_ERROR[0]!r}", ddp["where"])
    if ddp["find_unused"] and not ddp["static_graph"] and not unused:
        return _p10_not_needed(run, ddp)
    return None


def _p10_not_needed(run: RunEvents, ddp: Ddp) -> Finding | None:
    """find_unused_parameters=True although every parameter got a gradient every time."""
    by_rank = _steps(run)
    if len(by_rank) < run.world_size:
        return None
    synced = {r: sum(e["synced"] for e in steps) for r, steps in by_rank.items()}
    used = {r: sum(e["all_used"] for e in steps) for r, steps in by_rank.items()}
    if min(synced.values()) < 2 or any(used[r] != synced[r] for r in synced):
        return None
    return finding("P10", f"find_unused_parameters=True, but all {ddp['params']} parameters "
                          f"got a gradient in each of the {min(synced.values())} backward "
                          f"passes on every rank: an extra all-reduce and a graph search "
                          f"per step for nothing", ddp["where"], certainty="suspected")


def _error_text(run: RunEvents) -> str:
    return (str(run.error) if run.error else "") + "\n".join(run.logs.values())
