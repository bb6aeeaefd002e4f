"""Detector: data pitfalls from the data probe's passes (P03, P04, P18, P20, X1, X2)."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from course_lib.xray.probes.collectives import OPS
from course_lib.xray.report import Finding, finding
from course_lib.xray.rules import rule
from course_lib.xray.run_events import RunEvents

SAME_SHARE = 0.5  # ranks that share at least this fraction of their samples read the same data
COLLECTIVES_THAT_COMBINE = {name for name, op in OPS.items() if op.combines}

_METRIC = re.compile(r"\d\.\d|\d\s*%|\d\s*/\s*\d")  # 0.93, 93 %, 93/100: a measured value
Pass = dict[str, Any]


# -- why a run gave a rule nothing to judge ------------------------------------------------------

def _no_training(obs: RunEvents) -> str:
    if not any(_training(p) for _, p in obs.of("pass")):
        return "no training loop over a DataLoader ran"
    return ""


def _no_training_across_ranks(obs: RunEvents) -> str:
    return _no_training(obs) or ("one rank only" if obs.world_size < 2 else "")


def _no_second_epoch(obs: RunEvents) -> str:
    if _no_training(obs) or _repeated_training(obs):
        return _no_training(obs)
    return "no DataLoader was trained on for two epochs"


def _no_evaluation_across_ranks(obs: RunEvents) -> str:
    if obs.world_size < 2:
        return "one rank only"
    if not any(_eval(p) for _, p in obs.of("pass")):
        return "no evaluation loop over a DataLoader ran"
    return ""


# -- the passes, lined up across ranks --------------------------------------------------------

def _groups(obs: RunEvents) -> list[dict[int, Pass]]:
    """Passes by (loader, pass number), each a dict rank -> pass, every rank present."""
    by_key: dict[tuple, dict[int, Pass]] = defaultdict(dict)
    for rank, p in obs.of("pass"):
        by_key[(p["loader"], p["number"])][rank] = p
    return [g for g in by_key.values() if len(g) == obs.world_size >= 2]


def _training(p: Pass) -> bool:
    return p["backward"] > 0


def _eval(p: Pass) -> bool:
    return p["backward"] == 0 and bool(p["sizes"])


def _consumed(p: Pass) -> list[Any]:
    """The indices of the batches the loop took (a worker may have fetched more)."""
    return [i for batch in p["indices"][:len(p["sizes"])] for i in batch]


def _samples(p: Pass) -> list[float]:
    return [v for batch in p["fingerprints"] for v in batch]


def _line(p: Pass) -> str:
    """Where the pass's DataLoader was made."""
    return p["loader"].rsplit("#", 1)[0]


def _ranks(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 2:
        return f"rank {ranks[0]} and rank {ranks[1]}"
    return "ranks " + ", ".join(map(str, ranks))


def _shared(sets: list[set]) -> int:
    return len(set.intersection(*sets))


def _epoch(p: Pass) -> str:
    return f"epoch {p['number']}" if p["number"] else "the first epoch"


# -- P18 ----------------------------------------------------------------------------------------

@rule("P18", needs=("loader",),
      unjudged=lambda obs: "" if obs.of("loader") else "no DataLoader was made")
def _p18(obs: RunEvents) -> Finding | None:
    bad = [(r, e) for r, e in obs.of("loader") if e["shuffle"] and e["sampler"]]
    if not bad:
        return None
    _, e = bad[0]
    raised = "mutually exclusive with shuffle" in _error_text(obs)
    what = (" and DataLoader raised 'sampler option is mutually exclusive with shuffle'"
            if raised else "")
    return finding("P18", f"DataLoader(shuffle=True, sampler={e['sampler']}(...)) was made on "
                          f"{len({r for r, _ in bad})} rank(s){what}", e["where"])


def _error_text(obs: RunEvents) -> str:
    return str(obs.error) if obs.error is not None else ""


# -- P03 ----------------------------------------------------------------------------------------

@rule("P03", needs=("pass", "sampler"), unjudged=_no_training_across_ranks)
def _p03(obs: RunEvents) -> Finding | None:
    for group in _groups(obs):
        passes = [group[r] for r in sorted(group)]
        if not all(_training(p) for p in passes):
            continue
        twins, evidence = _twins(group)
        if evidence:
            return finding("P03", f"{_ranks(twins)} {evidence} in {_epoch(passes[0])}"
                                  f"{_unused_sampler(obs)}", _line(passes[0]))
        return None  # judged on the first training pass
    return None


def _twins(group: dict[int, Pass]) -> tuple[list[int], str]:
    """The first ranks that read the same data as another rank, and the evidence: all ranks
    alike, or only some (a sampler told another world size: ranks 0 and 2 of 4 alike)."""
    ranks = sorted(group)
    for r in ranks:
        twins = [s for s in ranks if s == r or _same_samples([group[r], group[s]])]
        if len(twins) > 1:
            evidence = _same_samples([group[s] for s in twins])
            if not evidence:  # alike in pairs, not all together: name one pair
                twins = twins[:2]
                evidence = _same_samples([group[s] for s in twins])
            return twins, evidence
    return [], ""


def _same_samples(passes: list[Pass]) -> str:
    """'read the same 32 samples ...' when the ranks read mostly the same data, else ''."""
    n = min(len(_consumed(p)) or len(_samples(p)) for p in passes)
    if n < 2:
        return ""
    content = [set(_samples(p)) for p in passes]
    varied = all(len(c) >= len(_samples(p)) / 2 for c, p in zip(content, passes))
    same_content = varied and _shared(content) >= SAME_SHARE * min(map(len, content))
    if all(_consumed(p) for p in passes):
        indices = [set(_consumed(p)) for p in passes]
        shared = _shared(indices)
        if shared < SAME_SHARE * min(map(len, indices)):
            return ""
        if varied and not same_content:
            return ""  # same positions, different data: the dataset itself is sharded
        size = passes[0]["dataset_len"]
        of = f" of the dataset's {size}" if size else ""
        return (f"read the same {shared} sample indices (each read {len(indices[0])}{of}; "
                f"{_sampler_text(passes[0])})")
    if same_content:
        return (f"read {_shared(content)} identical samples (compared by their values; "
                f"each read {len(content[0])})")
    return ""


def _sampler_text(p: Pass) -> str:
    settings = p["distributed"]
    if not settings:
        return f"the loader's {p['sampler']}, no DistributedSampler"
    return (f"DistributedSampler(num_replicas={settings['num_replicas']}, "
            f"rank={settings['rank']}) on rank 0")


def _unused_sampler(obs: RunEvents) -> str:
    """'; a DistributedSampler made at x.py:12 was never iterated' when one was."""
    used = {p["sampler_key"] for _, p in obs.of("pass")}
    unused = [e for _, e in obs.of("sampler") if e["key"] not in used]
    if not unused:
        return ""
    return (f"; a DistributedSampler made at {unused[0]['where']} was never given to a "
            "DataLoader that ran")


# -- P04 ----------------------------------------------------------------------------------------

def _repeated_training(obs: RunEvents) -> dict[tuple[int, str], list[Pass]]:
    """Per (rank, loader line), its complete training passes, when there are two or more."""
    runs: dict[tuple[int, str], list[Pass]] = defaultdict(list)
    for rank, p in obs.of("pass"):
        if _training(p) and p["done"]:
            runs[(rank, _line(p))].append(p)
    return {k: v for k, v in runs.items() if len(v) >= 2}


@rule("P04", needs=("pass", "set_epoch"), unjudged=_no_second_epoch)
def _p04(obs: RunEvents) -> Finding | None:
    repeated: dict[str, dict[int, list[Pass]]] = defaultdict(dict)
    for (rank, line), passes in _repeated_training(obs).items():
        repeated[line][rank] = [p for p in passes
                                if p["distributed"] and p["distributed"]["shuffle"]]
    for line, by_rank in repeated.items():
        first = by_rank[min(by_rank)]
        if len(first) < 2 or len(_consumed(first[0])) < 4:
            continue
        pair = _repeated_order(list(by_rank.values()))
        if pair is None:
            continue
        i, j = pair
        calls = sum(1 for _, e in obs.of("set_epoch"))
        n = len(_consumed(first[0]))
        every = len(first) > 2 and all(_consumed(p) == _consumed(first[0]) for p in first)
        when = f"all {len(first)} epochs" if every else f"epochs {i} and {j}"
        epoch = first[i]["distributed"]["epoch"]
        why = ("set_epoch() was never called" if not calls else
               f"the sampler's epoch was {epoch} at the start of "
               f"{'every epoch' if every else 'both'}")
        return finding("P04", f"every rank read its {n} samples in the same order in {when} "
                              f"(DistributedSampler(shuffle=True); {why})", line)
    return None


def _repeated_order(by_rank: list[list[Pass]]) -> tuple[int, int] | None:
    """The first two passes (i, j) that every rank read in exactly the same order."""
    count = min(len(ps) for ps in by_rank)
    for j in range(1, count):
        for i in range(j):
            if all(_consumed(ps[i]) == _consumed(ps[j]) for ps in by_rank):
                return i, j
    return None


# -- P20 ----------------------------------------------------------------------------------------

@rule("P20", needs=("pass", "join"), unjudged=_no_training_across_ranks, hides=("S1",))
def _p20(obs: RunEvents) -> Finding | None:
    """Ranks whose loaders ran out at different steps (their hang is P20's symptom, so the
    desync it ends in, S1, is not reported beside it)."""
    if any(e["enable"] for _, e in obs.of("join")):
        return None  # uneven inputs under Join (model.join()): handled
    groups = _groups(obs)
    for group in groups:
        if not any(_training(p) for p in group.values()):
            continue
        counts = {r: len(p["sizes"]) for r, p in group.items()}
        ended = {r: n for r, n in counts.items() if group[r]["done"]}
        if ended and max(counts.values()) > min(ended.values()):
            short = min(ended, key=ended.get)
            long = max(counts, key=counts.get)
            p = group[short]
            return finding("P20", f"in {_epoch(p)}, rank {short}'s loader ran out after "
                                  f"{ended[short]} batches while rank {long} took "
                                  f"{counts[long]}: rank {long}'s extra steps wait for a "
                                  f"peer that left the loop", _line(p))
    for group in groups:
        if not any(_training(p) for p in group.values()):
            continue
        if all(p["done"] for p in group.values()) and len({tuple(p["sizes"])
                                                           for p in group.values()}) > 1:
            sizes = {r: sum(p["sizes"]) for r, p in group.items()}
            p = next(iter(group.values()))
            text = ", ".join(f"rank {r}: {n}" for r, n in sorted(sizes.items()))
            return finding("P20", f"in {_epoch(p)} the ranks trained on different numbers "
                                  f"of samples ({text}): their gradients are averaged as if "
                                  f"equal", _line(p), certainty="suspected")
    return None


# -- X1 and X2 ----------------------------------------------------------------------------------

def _eval_groups(groups: list[dict[int, Pass]]) -> list[dict[int, Pass]]:
    return [g for g in groups if all(_eval(p) and p["done"] for p in g.values())]


def _combined_after(obs: RunEvents, rank: int, start: float, end: float) -> list[dict]:
    """The learner's collectives that combine values, on `rank` between two times."""
    return [e for r, e in obs.of("collective")
            if r == rank and start <= e["t"] <= end and e["op"] in COLLECTIVES_THAT_COMBINE]


@rule("X1", needs=("pass", "collective"), unjudged=_no_evaluation_across_ranks)
def _x1(obs: RunEvents) -> Finding | None:
    for group in _eval_groups(_groups(obs)):
        p = group[min(group)]
        settings, size = p["distributed"], p["dataset_len"]
        if not settings or not size or settings["total_size"] <= size:
            continue
        read = sum(len(_consumed(q)) for q in group.values())
        extra = read - len({i for q in group.values() for i in _consumed(q)})
        combined = _combined_after(obs, min(group), p["t"], _window_end(obs, p))
        if extra <= 0 or not combined:
            continue
        summed = any(e["op"] in ("all_reduce", "reduce") for e in combined)
        how = "summed them" if summed else "gathered them (a gather can drop the padding)"
        return finding("X1", f"in evaluation the {len(group)} ranks read {read} samples of a "
                             f"{size}-sample dataset and {how}: {extra} sample(s) counted "
                             f"twice (DistributedSampler pads each rank to "
                             f"{settings['total_size'] // settings['num_replicas']})",
                       _line(p), certainty="confirmed" if summed else "suspected")
    return None


def _window_end(obs: RunEvents, p: Pass) -> float:
    """When this evaluation's results were last in use on its rank: until the next training
    pass or the next pass of the same loader (else the end of the run). Other evaluation
    passes in between (imagenet's extra pass over the samples drop_last left out) add to
    the same numbers."""
    rank = _rank_of(obs, p)
    later = [e["t"] for r, e in obs.of("pass") if r == rank and e["t"] > p["t"]
             and (_training(e) or e["loader"] == p["loader"])]
    return min(later, default=float("inf"))


def _rank_of(obs: RunEvents, p: Pass) -> int:
    return next(r for r, events in obs.events.items() if any(e is p for e in events))


@rule("X2", needs=("pass", "print", "collective"), unjudged=_no_evaluation_across_ranks)
def _x2(obs: RunEvents) -> Finding | None:
    for group in _eval_groups(_groups(obs)):
        indices = [set(_consumed(p)) for p in group.values()]
        if not all(indices) or _shared(indices) >= SAME_SHARE * min(map(len, indices)):
            continue  # each rank evaluated everything: its own number is the whole set's
        for rank in sorted(group):
            p = group[rank]
            end = _window_end(obs, p)
            prints = [e for r, e in obs.of("print") if r == rank and p["end"] < e["t"] < end
                      and _METRIC.search(e["text"])]
            if not prints or _combined_after(obs, rank, p["t"], prints[0]["t"]):
                continue
            size = p["dataset_len"]
            of = f" of the {size} evaluation samples" if size else " of the evaluation samples"
            return finding("X2", f"rank {rank} printed {prints[0]['text'][:60]!r} after "
                                 f"evaluating {len(indices[rank])}{of}, with no collective "
                                 f"combining the ranks' results in between", prints[0]["where"])
    return None
