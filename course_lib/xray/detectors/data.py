"""Detector: the training data: replicas reading the same samples (P03; the ranks of one
tensor-parallel group must), the same order every epoch (P04), shuffle=True beside a
sampler (P18), uneven batches across ranks (P20)."""

from __future__ import annotations

from collections import defaultdict

from course_lib import words
from course_lib.xray.detectors.passes import (
    SAME_SHARE,
    consumed,
    epoch,
    grouped,
    in_all,
    loader_line,
    samples,
    training,
)
from course_lib.xray.detectors.tensor_parallel import tp_groups
from course_lib.xray.events import Join, Loader, Pass, Sampler, SetEpoch, TpPlan
from course_lib.xray.report import Finding, finding
from course_lib.xray.rules import rule
from course_lib.xray.run_events import RunEvents

# -- why a run gave a rule nothing to judge ------------------------------------------------------

def _no_training(run: RunEvents) -> str:
    if not any(training(p) for _, p in run.of(Pass)):
        return "no training loop over a DataLoader ran"
    return ""


def _no_training_across_ranks(run: RunEvents) -> str:
    return _no_training(run) or ("one rank only" if run.world_size < 2 else "")


def _one_replica(run: RunEvents) -> str:
    """P03's reason: no training across ranks, or every rank in one tensor-parallel group
    (one replica, whose ranks must read the same samples: TP4 judges them)."""
    groups = tp_groups(run)
    if _no_training_across_ranks(run) or len(groups) < run.world_size:
        return _no_training_across_ranks(run)
    if all(len(g) >= run.world_size for g in groups.values()):
        return ("every rank is in one tensor-parallel group, whose ranks must read the same "
                "samples (TP4)")
    return ""


def _no_second_epoch(run: RunEvents) -> str:
    if _no_training(run) or _repeated_training(run):
        return _no_training(run)
    return "no DataLoader was trained on for two epochs"


# -- P18 ----------------------------------------------------------------------------------------

@rule("P18", needs=(Loader,), absent="no DataLoader was given shuffle=True and a sampler",
      unjudged=lambda run: "" if run.of(Loader) else "no DataLoader was made")
def _p18(run: RunEvents) -> Finding | None:
    bad = [(r, e) for r, e in run.of(Loader) if e["shuffle"] and e["sampler"]]
    if not bad:
        return None
    _, e = bad[0]
    raised = "mutually exclusive with shuffle" in _error_text(run)
    what = (" and DataLoader raised 'sampler option is mutually exclusive with shuffle'"
            if raised else "")
    return finding("P18", f"DataLoader(shuffle=True, sampler={e['sampler']}(...)) was made on "
                          f"{len({r for r, _ in bad})} rank(s){what}", e["where"])


def _error_text(run: RunEvents) -> str:
    return str(run.error) if run.error is not None else ""


# -- P03 ----------------------------------------------------------------------------------------

@rule("P03", needs=(Pass, Sampler, TpPlan), unjudged=_one_replica,
      absent="no two replicas (ranks, or tensor-parallel groups) read the same samples in the "
             "first training pass over a loader")
def _p03(run: RunEvents) -> Finding | None:
    if _one_replica(run):
        return None
    peers = tp_groups(run)
    for group in grouped(run):
        passes = [group[r] for r in sorted(group)]
        if not all(training(p) for p in passes):
            continue
        twins, evidence = _twins(group, peers)
        if evidence:
            return finding("P03", f"{words.ranks(twins)} {evidence} in {epoch(passes[0])}"
                                  f"{_unused_sampler(run)}", loader_line(passes[0]))
        return None  # judged on the first training pass
    return None


def _twins(group: dict[int, Pass], peers: dict[int, tuple[int, ...]]) -> tuple[list[int], str]:
    """The first ranks that read the same data as another rank outside its tensor-parallel
    group (`peers`; a rank without one is its own), and the evidence: all ranks alike, or
    only some (a sampler told another world size: ranks 0 and 2 of 4 alike)."""
    ranks = sorted(group)
    for r in ranks:
        twins = [s for s in ranks if s == r or (s not in peers.get(r, (r,))
                                                and _same_samples([group[r], group[s]]))]
        if len(twins) > 1:
            evidence = _same_samples([group[s] for s in twins])
            if not evidence:  # alike in pairs, not all together: name one pair
                twins = twins[:2]
                evidence = _same_samples([group[s] for s in twins])
            return twins, evidence
    return [], ""


def _same_samples(passes: list[Pass]) -> str:
    """'read the same 32 samples ...' when the ranks read mostly the same data, else ''."""
    n = min(len(consumed(p)) or len(samples(p)) for p in passes)
    if n < 2:
        return ""
    content = [set(samples(p)) for p in passes]
    varied = all(len(c) >= len(samples(p)) / 2 for c, p in zip(content, passes))
    same_content = varied and in_all(content) >= SAME_SHARE * min(map(len, content))
    if all(consumed(p) for p in passes):
        indices = [set(consumed(p)) for p in passes]
        shared = in_all(indices)
        if shared < SAME_SHARE * min(map(len, indices)):
            return ""
        if varied and not same_content:
            return ""  # same positions, different data: the dataset itself is sharded
        size = passes[0]["dataset_len"]
        of = f" of the dataset's {size}" if size else ""
        return (f"read the same {shared} sample indices (each read {len(indices[0])}{of}; "
                f"{_sampler_text(passes[0])})")
    if same_content:
        return (f"read {in_all(content)} identical samples (compared by their values; "
                f"each read {len(content[0])})")
    return ""


def _sampler_text(p: Pass) -> str:
    settings = p["distributed"]
    if not settings:
        return f"the loader's {p['sampler']}, no DistributedSampler"
    return (f"DistributedSampler(num_replicas={settings['num_replicas']}, "
            f"rank={settings['rank']}) on rank 0")


def _unused_sampler(run: RunEvents) -> str:
    """'; a DistributedSampler made at x.py:12 was never iterated' when one was."""
    used = {p["sampler_key"] for _, p in run.of(Pass)}
    unused = [e for _, e in run.of(Sampler) if e["key"] not in used]
    if not unused:
        return ""
    return (f"; a DistributedSampler made at {unused[0]['where']} was never given to a "
            "DataLoader that ran")


# -- P04 ----------------------------------------------------------------------------------------

def _repeated_training(run: RunEvents) -> dict[tuple[int, str], list[Pass]]:
    """Per (rank, loader line), its complete training passes, when there are two or more."""
    runs: dict[tuple[int, str], list[Pass]] = defaultdict(list)
    for rank, p in run.of(Pass):
        if training(p) and p["done"]:
            runs[(rank, loader_line(p))].append(p)
    return {k: v for k, v in runs.items() if len(v) >= 2}


@rule("P04", needs=(Pass, SetEpoch), unjudged=_no_second_epoch,
      absent="no DistributedSampler(shuffle=True) gave the ranks the same order in two epochs")
def _p04(run: RunEvents) -> Finding | None:
    repeated: dict[str, dict[int, list[Pass]]] = defaultdict(dict)
    for (rank, line), passes in _repeated_training(run).items():
        repeated[line][rank] = [p for p in passes
                                if p["distributed"] and p["distributed"]["shuffle"]]
    for line, by_rank in repeated.items():
        first = by_rank[min(by_rank)]
        if len(first) < 2 or len(consumed(first[0])) < 4:
            continue
        pair = _repeated_order(list(by_rank.values()))
        if pair is None:
            continue
        i, j = pair
        calls = sum(1 for _, e in run.of(SetEpoch))
        n = len(consumed(first[0]))
        every = len(first) > 2 and all(consumed(p) == consumed(first[0]) for p in first)
        when = f"all {len(first)} epochs" if every else f"epochs {i} and {j}"
        settings = first[i]["distributed"]
        epoch = settings["epoch"] if settings else 0
        why = ("set_epoch() was never called" if not calls else
               f"the sampler's epoch was {epoch} at the start of "
               f"{'every epoch' if every else 'both'}")
        loop = first[j]["where"]
        return finding("P04", f"every rank read its {n} samples in the same order in {when} "
                              f"(the DataLoader made at {line} has a DistributedSampler("
                              f"shuffle=True); {why}): call sampler.set_epoch(epoch) before "
                              "this loop, in each epoch", loop or line)
    return None


def _repeated_order(by_rank: list[list[Pass]]) -> tuple[int, int] | None:
    """The first two passes (i, j) that every rank read in exactly the same order."""
    count = min(len(ps) for ps in by_rank)
    for j in range(1, count):
        for i in range(j):
            if all(consumed(ps[i]) == consumed(ps[j]) for ps in by_rank):
                return i, j
    return None


# -- P20 ----------------------------------------------------------------------------------------

@rule("P20", needs=(Pass, Join), unjudged=_no_training_across_ranks, hides=("S1",),
      absent="no rank's training loader ran out before another's or gave it fewer samples "
             "(outside Join)")
def _p20(run: RunEvents) -> Finding | None:
    """Ranks whose loaders ran out at different steps (their hang is P20's symptom, so the
    desync it ends in, S1, is not reported beside it)."""
    if any(e["enable"] for _, e in run.of(Join)):
        return None  # uneven inputs under Join (model.join()): handled
    groups = grouped(run)
    for group in groups:
        if not any(training(p) for p in group.values()):
            continue
        counts = {r: len(p["sizes"]) for r, p in group.items()}
        ended = {r: n for r, n in counts.items() if group[r]["done"]}
        if ended and max(counts.values()) > min(ended.values()):
            short = min(ended, key=lambda r: ended[r])
            long = max(counts, key=lambda r: counts[r])
            p = group[short]
            return finding("P20", f"in {epoch(p)}, rank {short}'s loader ran out after "
                                  f"{ended[short]} batches while rank {long} took "
                                  f"{counts[long]}: rank {long}'s extra steps wait for a "
                                  f"peer that left the loop", loader_line(p))
    for group in groups:
        if not any(training(p) for p in group.values()):
            continue
        if all(p["done"] for p in group.values()) and len({tuple(p["sizes"])
                                                           for p in group.values()}) > 1:
            sizes = {r: sum(p["sizes"]) for r, p in group.items()}
            p = next(iter(group.values()))
            text = ", ".join(f"rank {r}: {n}" for r, n in sorted(sizes.items()))
            return finding("P20", f"in {epoch(p)} the ranks trained on different numbers "
                                  f"of samples ({text}): their gradients are averaged as if "
                                  f"equal", loader_line(p), certainty="suspected")
    return None
