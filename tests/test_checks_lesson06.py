"""Lesson 06's check accepts the worked solution and a differently written correct answer, and
rejects plausible wrong answers, each with the hint that names what went wrong."""

import numpy as np
import pytest
from verdicts import ACCEPTED, Solution, cases, verdicts_for

from course_lib.checks.lesson06 import check_all_reduce_waits

NOTEBOOK = "06_profiling.ipynb"

judged = verdicts_for(NOTEBOOK)


def union(intervals):
    """Seconds covered by (start, end) rows of a 2-D array, overlaps once (NumPy)."""
    if not len(intervals):
        return 0.0
    rows = intervals[np.argsort(intervals[:, 0])]
    reach = np.maximum.accumulate(rows[:, 1])
    starts = np.maximum(rows[1:, 0], reach[:-1])
    return float(rows[0, 1] - rows[0, 0] + np.clip(rows[1:, 1] - starts, 0, None).sum())


def answer(events, name="gloo:all_reduce", split="last", overlap_once=True, scale=1e-6,
           same_for_all=False):
    """A configurable answer: right with the defaults, each argument one plausible mistake."""
    rows = [(e["pid"], e["ts"], e["ts"] + e["dur"]) for e in events
            if e.get("ph") == "X" and e["name"] == name]
    ranks = sorted({r for r, _, _ in rows})
    mine = {r: np.array(sorted((s, e) for q, s, e in rows if q == r)) for r in ranks}
    starts = np.stack([mine[r][:, 0] for r in ranks])  # rank x k-th all-reduce
    moment = starts.max(axis=0) if split == "last" else starts.min(axis=0)
    measure = union if overlap_once else (lambda iv: float((iv[:, 1] - iv[:, 0]).sum()))
    out = {}
    for r in ranks:
        source = ranks[0] if same_for_all else r
        begin, end = mine[source][:, 0], mine[source][:, 1]
        if split == "last":
            waits = np.stack([begin, np.minimum(moment, end)], axis=1)
        elif split == "first":
            waits = np.stack([moment, begin], axis=1)
        else:
            waits = np.zeros((0, 2))
        out[r] = {"all_reduce": measure(mine[source]) * scale, "waiting": measure(waits) * scale}
    return out


def with_numpy(events):
    return answer(events)


def in_microseconds(events):
    return answer(events, scale=1.0)


def handoff_slices(events):
    return answer(events, name="c10d::allreduce_")


def no_wait_split(events):
    return answer(events, split=None)


def summed_not_union(events):
    return answer(events, overlap_once=False)


def wait_from_first_start(events):
    return answer(events, split="first")


def rank0_for_everyone(events):
    return answer(events, same_for_all=True)


def a_list(events):
    return list(answer(events).values())


def sweep_line(events):
    """Correct, written otherwise (a review's answer): a +1/-1 sweep for the union, and the
    wait of the k-th all-reduce cut at the last rank's start."""
    def union(intervals):
        marks = sorted([(s, 1) for s, e in intervals] + [(e, -1) for s, e in intervals],
                       key=lambda m: (m[0], -m[1]))
        depth, total, opened = 0, 0.0, None
        for t, d in marks:
            if depth == 0 and d == 1:
                opened = t
            depth += d
            if depth == 0 and d == -1:
                total += t - opened
        return total
    found = {}
    for e in events:
        if e.get("name") == "gloo:all_reduce" and "dur" in e:
            found.setdefault(e["pid"], []).append((e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6))
    ranks = sorted(found)
    for r in ranks:
        found[r].sort()
    waits = {r: [] for r in ranks}
    for k in range(len(found[ranks[0]])):
        last = max(found[r][k][0] for r in ranks)
        for r in ranks:
            s, e = found[r][k]
            if last > s:
                waits[r].append((s, min(e, last)))
    return {r: {"all_reduce": union(found[r]), "waiting": union(waits[r])} for r in ranks}


def _covered(intervals):
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _slices(events):
    found = {}
    for e in events:
        if e.get("ph") == "X" and e["name"] == "gloo:all_reduce":
            found.setdefault(e["pid"], []).append((e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6))
    return found


def minus_the_least(events):
    """A review's wrong answer: the rank with the least all-reduce time never waited, the
    others' extra time is waiting."""
    busy = {r: _covered(v) for r, v in _slices(events).items()}
    least = min(busy.values())
    return {r: {"all_reduce": b, "waiting": b - least} for r, b in busy.items()}


def summed_per_all_reduce(events):
    """A review's wrong answer: each all-reduce's wait summed, no union."""
    found = {r: sorted(v) for r, v in _slices(events).items()}
    ranks = sorted(found)
    out = {r: {"all_reduce": _covered(found[r]), "waiting": 0.0} for r in ranks}
    for same in zip(*(found[r] for r in ranks)):
        last = max(s for s, _ in same)
        for r, (s, e) in zip(ranks, same):
            out[r]["waiting"] += min(last, e) - s
    return out


# (answer, the hint the check's message must hold; ACCEPTED: the check passes the answer)
ALL_REDUCE_WAITS = [
    (Solution("all_reduce_waits"), ACCEPTED),
    (with_numpy, ACCEPTED),
    (sweep_line, ACCEPTED),
    (in_microseconds, "that is microseconds"),
    (handoff_slices, "only hands each bucket"),
    (no_wait_split, "you found no waiting at all"),
    (summed_not_union, "measure the union of the intervals"),
    (summed_per_all_reduce, "counts twice the moments when two all-reduces were in flight"),
    (wait_from_first_start, "not from the first rank's start"),
    (rank0_for_everyone, "every rank got rank 0's"),
    (minus_the_least, "you took each rank's all-reduce time minus the least of any rank as "
                      "its waiting"),
    (a_list, "return a dict with one entry per rank"),
]


@pytest.mark.parametrize("check, answer, hint", cases(check_all_reduce_waits, ALL_REDUCE_WAITS))
def test_the_check_judges_the_answer(check, answer, hint, capsys):
    """A right answer passes; a wrong one fails with the hint that names its mistake."""
    judged(check, answer, hint, capsys)
