"""Detector: tensor parallelism's inputs: the ranks of one tensor-parallel group fed
different data (TP4), and on a 2-D mesh, read by the global rank instead of the data-parallel
one (TP8). What the group computes once fed is tensor_parallel_steps.py's (TP5, TP9).

A tensor-parallel group is the mesh that parallelize_module was given (events.TpPlan): its
ranks compute one forward together, so each must be fed the same batch. What they were fed
is read first from the parallelized module's own inputs (events.TpInput, when they came
from outside the model), else from their training passes over a DataLoader.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from course_lib.xray.detectors.passes import loader_line, training
from course_lib.xray.events import Pass, Sampler, Seed, TpInput, TpPlan
from course_lib.xray.report import Finding, finding
from course_lib.xray.rules import rule
from course_lib.xray.run_events import RunEvents

SHOWN = 4  # samples shown per rank
BATCHES = 4  # first training batches compared


@dataclass(frozen=True)
class Split:
    """Two ranks of one tensor-parallel group fed different data, and what each read."""

    plan: TpPlan  # the lower rank's parallelize_module call
    a: int
    b: int
    step: int  # the step (forward or batch) where they first differ
    training: bool  # a training step (else an evaluation's)
    read: str  # what each read: "rank 0 read samples [...], rank 1 [...]"
    source: str  # where the data came from: the sampler's settings, or ""
    where: str  # the learner's line where the fix goes


def tp_groups(run: RunEvents) -> dict[int, tuple[int, ...]]:
    """Each rank's tensor-parallel group: the ranks of the mesh its first parallelize_module
    call was given (ranks that made no call are absent)."""
    groups: dict[int, tuple[int, ...]] = {}
    for rank, e in run.of(TpPlan):
        groups.setdefault(rank, tuple(sorted(e["group"])))
    return groups


def first_plans(run: RunEvents) -> dict[int, TpPlan]:
    plans: dict[int, TpPlan] = {}
    for rank, e in run.of(TpPlan):
        plans.setdefault(rank, e)
    return plans


# -- why a run gave these rules nothing to judge ------------------------------------------------

def no_group(run: RunEvents) -> str:
    if not run.of(TpPlan):
        return "parallelize_module was not called"
    if all(len(g) < 2 for g in tp_groups(run).values()):
        return "every tensor-parallel mesh held one rank"
    return ""


def _nothing_compared(run: RunEvents) -> str:
    return no_group(run) or ("" if _compared(run) else
                              "no forward of the parallelized model and no training pass "
                              "over a DataLoader ran on every rank of a tensor-parallel group")


def _no_2d_mesh(run: RunEvents) -> str:
    if no_group(run):
        return no_group(run)
    if all(len(g) >= run.world_size for g in tp_groups(run).values()):
        return "no 2-D mesh: the tensor-parallel mesh held every rank"
    return _nothing_compared(run)


# -- TP4 and TP8 --------------------------------------------------------------------------------

@rule("TP4", needs=(TpPlan, TpInput, Pass, Sampler, Seed), unjudged=_nothing_compared,
      absent="no two ranks of one tensor-parallel group were fed different inputs (the "
             "parallelized model's first forwards, or their first training batches)")
def _tp4(run: RunEvents) -> Finding | None:
    split = _split(run)
    if split is None:
        return None
    p = split.plan
    size = len(tp_groups(run)[split.a])
    over = f"all {size} ranks" if size >= run.world_size else f"{size} of {run.world_size} ranks"
    return finding("TP4", f"ranks {split.a} and {split.b}, one tensor-parallel group "
                          f"(parallelize_module at {p['where']} over {over}), were fed "
                          f"different batches {_at(split)}: {split.read}"
                          f"{in_parens(split.source)}; the ranks of a tensor-parallel group "
                          "compute one forward together and must be fed the same batch"
                          f"{_tp4_fix(split)}",
                   split.where)


@rule("TP8", needs=(TpPlan, TpInput, Pass, Sampler, Seed), unjudged=_no_2d_mesh,
      hides=("TP4",),
      absent="no two ranks of one tensor-parallel group of a 2-D mesh were fed different "
             "inputs (first forwards, or first training batches)")
def _tp8(run: RunEvents) -> Finding | None:
    split = _split(run)
    if split is None or len(tp_groups(run)[split.a]) >= run.world_size:
        return None
    p = split.plan
    shape = " x ".join(map(str, p["mesh_shape"]))
    names = f" ({', '.join(repr(d) for d in p['mesh_dims'])})" if p["mesh_dims"] else ""
    tp = f"mesh[{p['dim']!r}], " if p["dim"] else ""
    dp = next((d for d in p["mesh_dims"] if d != p["dim"]), "")
    replicas = math.prod(p["mesh_shape"]) // max(1, len(p["group"]))
    how = (f"num_replicas=mesh[{dp!r}].size(), rank=mesh[{dp!r}].get_local_rank()" if dp else
           "num_replicas= the data-parallel dimension's size, rank= this rank's place in it")
    return finding("TP8", f"on the {shape} mesh{names}, ranks {split.a} and {split.b} form "
                          f"one tensor-parallel group ({tp}parallelize_module at {p['where']}) "
                          f"and were fed different batches {_at(split)}: "
                          f"{split.read}{in_parens(split.source)}; the sampler and the per-replica "
                          f"seed must come from the data-parallel rank: {replicas} replicas, "
                          f"{how}", split.where)


def _tp4_fix(split: Split) -> str:
    """What gives the group one batch, for where this one came from."""
    if split.source.startswith("torch.manual_seed"):
        return (" (the same seed on every rank of the group; a per-replica seed comes from the "
                "data-parallel rank)")
    if split.source.startswith("DistributedSampler"):
        return (" (the group is one data-parallel replica: DistributedSampler(num_replicas=1, "
                "rank=0) when every rank is in it)")
    if split.source:
        return " (the same seed, or generator, for the loader on every rank of the group)"
    return " (made from the same data, or the same seed, on every rank of the group)"


def _at(split: Split) -> str:
    kind = "training step" if split.training else "evaluation step"
    return f"in their first {kind}" if split.step == 0 else f"in {kind} {split.step + 1}"


def in_parens(source: str) -> str:
    return f" ({source})" if source else ""


def _compared(run: RunEvents) -> bool:
    """Some forward input or training batch was seen on every rank of a TP group."""
    groups = {g for g in tp_groups(run).values() if len(g) >= 2}
    return any(_input_verdict(run, g)[0] or _batch_split(run, g) is not None
               or _passes_of(run, g) for g in groups)


def _split(run: RunEvents) -> Split | None:
    """The first two ranks of one tensor-parallel group fed different data: by the
    parallelized module's inputs when it was fed data, else by their training batches."""
    plans = first_plans(run)
    for group in sorted({g for g in tp_groups(run).values() if len(g) >= 2}):
        if any(r not in plans for r in group) or _sharded_on_purpose(run, group):
            continue
        verdict, a, b, step = _input_verdict(run, group)
        if verdict == "same":
            continue
        batch = _batch_split(run, group)
        if verdict == "differ":
            return _explained(run, plans[a], a, b, step, batch)
        if batch is not None:
            return _explained(run, plans[batch[0]], batch[0], batch[1], (True, batch[2]),
                              batch)
    return None


def _sharded_on_purpose(run: RunEvents, group: tuple[int, ...]) -> bool:
    """The plan itself declares a parallelized module's input sharded over the group
    (PrepareModuleInput(input_layouts=Shard(...))): each rank may read its own share."""
    return any("Shard" in e["layout"] for r, e in run.of(TpInput) if r in group)


def _input_verdict(run: RunEvents,
                   group: tuple[int, ...]) -> tuple[str, int, int, tuple[bool, int]]:
    """("differ", a, b, (training, number)): the first forward (training ones first) at
    which two ranks fed the parallelized module different data; ("same", ...) when every
    one compared was the same; ("", ...) when no input from outside the model was seen on
    every rank."""
    seen: dict[tuple[bool, str, int], dict[int, TpInput]] = defaultdict(dict)
    for rank, e in run.of(TpInput):
        if rank in group and e["data"]:
            seen[(not e["grad"], e["plan"], e["number"])][rank] = e
    compared = False
    for (evaluating, _, number), by_rank in sorted(seen.items()):
        if len(by_rank) < len(group):
            continue
        compared = True
        first = by_rank[group[0]]
        for r in group[1:]:
            if by_rank[r]["fingerprint"] != first["fingerprint"]:
                return "differ", group[0], r, (not evaluating, number)
    return ("same" if compared else ""), 0, 0, (True, 0)


def _passes_of(run: RunEvents, group: tuple[int, ...]) -> dict[int, Pass]:
    """Each rank's first training pass when every rank of the group made one, else each
    rank's first pass that read a batch (an evaluation must be fed the same data too)."""
    for kind in (training, lambda p: True):
        first: dict[int, Pass] = {}
        for rank, p in run.of(Pass):
            if rank in group and p["sizes"] and kind(p):
                first.setdefault(rank, p)
        if len(first) == len(group):
            return first
    return {}


def _batch_split(run: RunEvents, group: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(a, b, batch): the first of the first training batches two ranks read differently."""
    passes = _passes_of(run, group)
    if not passes:
        return None
    first = passes[group[0]]
    for batch in range(min(BATCHES, *(len(p["sizes"]) for p in passes.values()))):
        for r in group[1:]:
            if passes[r]["fingerprints"][batch] != first["fingerprints"][batch] or \
                    _indices(passes[r], batch) != _indices(first, batch):
                return group[0], r, batch
    return None


def _indices(p: Pass, batch: int) -> list[object]:
    return list(p["indices"][batch]) if batch < len(p["indices"]) else []


def _explained(run: RunEvents, plan: TpPlan, a: int, b: int, step: tuple[bool, int],
               batch: tuple[int, int, int] | None) -> Split:
    """What ranks a and b read (their training batches when those differ too, else the
    inputs they fed the model) and where that came from: the sampler's line, else the
    loader's, else the forward's."""
    if batch is None:
        fed = {r: e for r, e in run.of(TpInput) if r in (a, b) and e["data"]
               and (e["grad"], e["number"]) == step}
        read = ", ".join(f"rank {r} fed values {_shown(fed[r]['fingerprint'])}"
                         for r in (a, b) if r in fed) + " (one number per sample)"
        if a not in fed or b not in fed:
            return Split(plan, a, b, step[1], step[0], read, "", plan["where"])
        seeded, where = seeds_in_words(run, (a, fed[a]["t"]), (b, fed[b]["t"]))
        return Split(plan, a, b, step[1], step[0], read, seeded, where or fed[a]["where"])
    passes = _passes_of(run, tuple(sorted({a, b})))
    k = batch[2]
    read = (f"rank {a} read samples {_shown(_indices(passes[a], k))}, rank {b} "
            f"{_shown(_indices(passes[b], k))}")
    return Split(plan, a, b, k, training(passes[a]), read, _source(run, passes, a, b),
                 _fix_line(run, a, passes[a]))


def _shown(values: list[object] | list[float]) -> str:
    head = [str(int(v)) if isinstance(v, float) and v.is_integer() else
            f"{v:.4g}" if isinstance(v, float) else str(v) for v in values[:SHOWN]]
    return "[" + ", ".join(head) + (", ...]" if len(values) > SHOWN else "]")


def _source(run: RunEvents, passes: dict[int, Pass], a: int, b: int) -> str:
    """The samplers that chose each rank's samples, in words."""
    sa, sb = passes[a]["distributed"], passes[b]["distributed"]
    if sa is None or sb is None:
        sampler = passes[a]["sampler"]
        return (f"the DataLoader's {sampler}, which draws its order from each rank's own "
                "random seed" if passes[a]["random"] else f"the DataLoader's {sampler}")
    world = (": the global world size and rank" if sa["num_replicas"] == run.world_size
             and (sa["rank"], sb["rank"]) == (a, b) else "")
    return (f"DistributedSampler(num_replicas={sa['num_replicas']}, rank={sa['rank']}) on "
            f"rank {a}, rank={sb['rank']} on rank {b}{world}")


def seeds_in_words(run: RunEvents, a: tuple[int, float], b: tuple[int, float]) -> tuple[str, str]:
    """The seeds two ranks last gave torch.manual_seed before the times given, in words,
    and the line of rank a's, when they differ (else "", "")."""
    last = {}
    for rank, before in (a, b):
        seeds = [e for r, e in run.of(Seed) if r == rank and e["t"] <= before]
        if not seeds:
            return "", ""
        last[rank] = seeds[-1]
    sa, sb = last[a[0]], last[b[0]]
    if sa["value"] == sb["value"]:
        return "", ""
    at = sa["where"] if sa["where"] == sb["where"] else f"{sa['where']} and {sb['where']}"
    return (f"torch.manual_seed at {at}: {sa['value']} on rank {a[0]}, {sb['value']} on rank "
            f"{b[0]}"), sa["where"]


def _fix_line(run: RunEvents, rank: int, p: Pass) -> str:
    """Where the DistributedSampler of this pass was made, else where its loader was."""
    made = [e["where"] for r, e in run.of(Sampler) if r == rank and e["key"] == p["sampler_key"]]
    return made[0] if made and p["distributed"] else loader_line(p)
