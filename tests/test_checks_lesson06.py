"""Lesson 06's check accepts the worked solution and a differently written correct answer, and
rejects plausible wrong answers, each with the hint that names what went wrong."""

import numpy as np
import pytest
from checking import check_helpers

from course_lib.checks.lesson06 import check_time_breakdown

NOTEBOOK = "06_profiling.ipynb"
COMPUTE = ("forward", "backward", "optimizer")

solution, accepts, rejects = check_helpers(NOTEBOOK)


def covered(intervals):
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def spans_of(tel, rank, names):
    s = tel.spans.where(rank=rank)
    keep = np.isin(s["name"], names)
    return float((s["end"] - s["start"])[keep].sum())


def calls_of(tel):
    """(step, bucket) -> arrays of rank, start, end, with NumPy grouping."""
    c = tel.comms
    keys = np.stack([c["step"], c["bucket"]], axis=1)
    out = {}
    for key in np.unique(keys, axis=0):
        rows = (keys == key).all(axis=1)
        out[tuple(key)] = (c["rank"][rows], c["start"][rows], c["end"][rows])
    return out


def breakdown(tel, compute=COMPUTE, split="last", union=True, scale=1.0, same_for_all=False):
    """A configurable answer: right with the defaults, each argument one plausible mistake."""
    inside = {r: [] for r in tel.ranks}
    waiting = {r: [] for r in tel.ranks}
    for ranks, starts, ends in calls_of(tel).values():
        moment = starts.max() if split == "last" else starts.min()
        for r, s, e in zip(ranks, starts, ends):
            inside[int(r)].append((s, e))
            if split == "last":
                waiting[int(r)].append((s, min(moment, e)))
            elif split == "first":
                waiting[int(r)].append((moment, s))
    measure = covered if union else (lambda iv: sum(e - s for s, e in iv))
    out = {}
    for r in tel.ranks:
        source = tel.ranks[0] if same_for_all else r
        wait = measure(waiting[source])
        out[r] = {k: v * scale for k, v in {
            "compute": spans_of(tel, source, compute), "data": spans_of(tel, source, ["data"]),
            "wait": wait, "communication": measure(inside[source]) - wait}.items()}
    return out


def with_numpy(tel):
    return breakdown(tel)


@pytest.mark.parametrize("fn", ["solution", with_numpy])
def test_time_breakdown_accepts(fn, capsys):
    fn = solution("time_breakdown") if fn == "solution" else fn
    accepts(check_time_breakdown, fn, capsys)


def in_milliseconds(tel):
    return breakdown(tel, scale=1e3)


def waiting_counted_as_compute(tel):
    return breakdown(tel, compute=(*COMPUTE, "wait for all-reduce"))


def no_wait_split(tel):
    return breakdown(tel, split=None)


def summed_not_union(tel):
    return breakdown(tel, union=False)


def wait_from_first_arrival(tel):
    return breakdown(tel, split="first")


def rank0_for_everyone(tel):
    return breakdown(tel, same_for_all=True)


def a_list(tel):
    return [breakdown(tel)[r] for r in tel.ranks]


@pytest.mark.parametrize("fn, hint", [
    (in_milliseconds, "that is milliseconds; report seconds"),
    (waiting_counted_as_compute, "includes the 'wait for all-reduce' spans"),
    (no_wait_split, "you counted all the time inside the all-reduces as communication"),
    (summed_not_union, "measure the union of the intervals"),
    (wait_from_first_arrival, "not from the first rank's start"),
    (rank0_for_everyone, "every rank got rank 0's"),
    (a_list, "return a dict with one entry per rank"),
])
def test_time_breakdown_rejects(fn, hint, capsys):
    rejects(check_time_breakdown, fn, hint, capsys)
