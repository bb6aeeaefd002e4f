"""Lesson 06's check accepts the worked solution and a differently written correct answer, and
rejects plausible wrong answers, each with the hint that names what went wrong."""

import numpy as np
import pytest
from checking import check_helpers

from course_lib.checks.lesson06 import check_all_reduce_waits

NOTEBOOK = "06_profiling.ipynb"

solution, accepts, rejects = check_helpers(NOTEBOOK)


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


@pytest.mark.parametrize("fn", ["solution", with_numpy])
def test_all_reduce_waits_accepts(fn, capsys):
    fn = solution("all_reduce_waits") if fn == "solution" else fn
    accepts(check_all_reduce_waits, fn, capsys)


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


@pytest.mark.parametrize("fn, hint", [
    (in_microseconds, "that is microseconds"),
    (handoff_slices, "only hands each bucket"),
    (no_wait_split, "you found no waiting at all"),
    (summed_not_union, "measure the union of the intervals"),
    (wait_from_first_start, "not from the first rank's start"),
    (rank0_for_everyone, "every rank got rank 0's"),
    (a_list, "return a dict with one entry per rank"),
])
def test_all_reduce_waits_rejects(fn, hint, capsys):
    rejects(check_all_reduce_waits, fn, hint, capsys)
