"""Check for lesson 06's exercise: from a merged torch.profiler trace, each rank's time inside
gloo's all-reduces and the part of it spent waiting for the last rank. The check profiles real
runs (one with all ranks alike, two with a straggler) at two world sizes, merges each run's
per-rank traces with telemetry.merge_traces, as the lesson does, calls the learner's function
on the merged events and compares with what it computes itself from the same events."""

from __future__ import annotations

import json
import numbers
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, at_world_sizes, check, close, is_stub
from course_lib.teach.profiling import covered
from course_lib.telemetry import merge_traces

KEYS = ("all_reduce", "waiting")
SLICE = "gloo:all_reduce"  # the all-reduce itself, on one of gloo's threads
HANDOFF = "c10d::allreduce_"  # the Python thread handing a bucket to gloo (returns at once)
# Per world size, the runs profiled: the straggler rank (None: all ranks alike). The
# straggler sleeps SLOW_S per batch, the others FAST_S: far apart, so that waiting shows.
RUNS = {2: (None, 1), 3: (0,)}
FAST_S, SLOW_S = 0.002, 0.03
STEPS = 5
ATOL = 1e-6  # seconds: sums in another order differ by far less; a mistake by far more


# -- on the ranks: profile runs -----------------------------------------------------------------

def _profile_runs(fn: Callable, slow_ranks: tuple[int | None, ...], folder: str) -> None:
    """Train a small DDP model once per straggler setting under torch.profiler; each rank
    writes its trace of run i to folder/i/rank<rank>.json. (fn runs in the kernel.)"""
    for i, slow in enumerate(slow_ranks):
        _profile_run(slow, Path(folder) / str(i))


def _profile_run(slow_rank: int | None, folder: Path) -> None:
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)),
                bucket_cap_mb=0.25)  # a bucket per layer, at times in flight together
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    pause = SLOW_S if dist.get_rank() == slow_rank else FAST_S
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            time.sleep(pause)  # a data loader: slower on the straggler
            loss = model(torch.randn(16, 256)).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        dist.barrier()  # every all-reduce has finished, and is recorded whole
    folder.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(folder / f"rank{dist.get_rank()}.json"))


# -- the truth, from a merged trace ---------------------------------------------------------------

def slices(events: list[dict], name: str = SLICE) -> dict[int, list[tuple[float, float]]]:
    """Per rank (the merged trace's pid), the (start, end) seconds of its `name` slices, in
    order of start: the k-th of every rank is the same collective (ranks issue them in order)."""
    out: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("name") == name and e.get("ph") == "X":
            out.setdefault(int(e["pid"]), []).append((e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6))
    return {rank: sorted(found) for rank, found in sorted(out.items())}


def all_reduce_waits(events: list[dict], split: str = "last",
                     measure: Callable = covered) -> dict[int, dict[str, float]]:
    """Per rank, seconds inside its all-reduces and, of those, seconds before the last rank's
    slice of the same all-reduce started ("waiting"). `split` and `measure` other than the
    defaults give two plausible mistakes, for the hints."""
    found = slices(events)
    if len({len(v) for v in found.values()}) != 1:
        raise ValueError(f"the ranks' traces hold different numbers of {SLICE} slices: "
                         f"{ {r: len(v) for r, v in found.items()} }")
    waiting: dict[int, list] = {rank: [] for rank in found}
    for same in zip(*found.values()):  # the k-th all-reduce of every rank
        first, last = min(s for s, _ in same), max(s for s, _ in same)
        for rank, (start, end) in zip(found, same):
            waiting[rank].append((start, min(last, end)) if split == "last" else (first, start))
    return {rank: {"all_reduce": measure(found[rank]), "waiting": measure(waiting[rank])}
            for rank in found}


def _summed(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


# -- in the kernel: judge -----------------------------------------------------------------------

@check
def check_all_reduce_waits(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(events) must return {rank: {"all_reduce": seconds, "waiting": seconds}}."""
    judged = []
    with tempfile.TemporaryDirectory(prefix="check06-") as tmp:
        sizes = at_world_sizes(_profile_runs, fn, tuple(RUNS), timeout=timeout,
                               args=lambda n: (RUNS[n], f"{tmp}/{n}"))
        for n, _ in sizes:
            for i, slow in enumerate(RUNS[n]):
                merged = merge_traces(sorted(Path(tmp, str(n), str(i)).glob("rank*.json")),
                                      Path(tmp, f"merged-{n}-{i}.json"))
                hint = _hint(fn, merged)
                if hint:
                    raise Rejected(f"{_run_name(n, slow)}: {hint}")
                judged.append(_run_name(n, slow))
    return (f"{'; '.join(judged)}: every rank's all-reduce and waiting seconds match the "
            "truth.")


def _run_name(n: int, slow: int | None) -> str:
    if slow is None:
        return f"on {n} ranks loading data at the same speed"
    return f"on {n} ranks where rank {slow} loads its data {SLOW_S * 1e3:.0f} ms per step slower"


def _events(merged: Path) -> list[dict]:
    """A fresh copy of the merged trace's events (an answer that edits them changes nothing)."""
    return json.loads(merged.read_text())["traceEvents"]


def _call(fn: Callable, events: list[dict]) -> Any:
    name = getattr(fn, "__name__", "your function")
    try:
        return fn(events)
    except Exception as error:
        if is_stub(error):
            raise  # @check says it is not written yet
        raise Rejected(f"{name}(events) raised {type(error).__name__}: {error}") from None


def _hint(fn: Callable, merged: Path) -> str | None:
    """None when fn's answer on this trace matches the truth, else what this answer did."""
    events = _events(merged)
    want = all_reduce_waits(events)
    got = _call(fn, _events(merged))
    shape = _shape_hint(got, list(want))
    if shape:
        return shape
    wrong = [(r, k) for r in want for k in KEYS if not close(got[r][k], want[r][k], atol=ATOL)]
    if not wrong:
        return None
    rank, key = wrong[0]
    value, true = float(got[rank][key]), want[rank][key]
    for scale, unit in ((1e6, "microseconds (a trace's ts and dur are µs)"), (1e3, "milliseconds")):
        if true and close(value, true * scale, atol=ATOL * scale):
            return f"rank {rank}'s {key} is {value:.4g}: that is {unit}; report seconds."
    if len(want) > 1 and all(close(got[r][key], want[0][key], atol=ATOL) for r in want):
        return (f"every rank got rank 0's {key} ({want[0][key]:.4f} s): in the merged trace "
                "each rank is one process; take each rank's own events (e['pid'] == rank).")
    return _mistake_hint(got, events, want, rank, key)


def _mistake_hint(got: dict, events: list[dict], want: dict, rank: int, key: str) -> str:
    if _matches(got, all_reduce_waits(events, measure=_summed), [key]):
        return (f"rank {rank}'s {key} {got[rank][key] * 1e3:.1f} ms counts twice the moments "
                f"when two all-reduces were in flight together on gloo's two threads (truth: "
                f"{want[rank][key] * 1e3:.1f} ms): measure the union of the intervals, not the "
                "sum of their lengths.")
    handoff = {r: covered(v) for r, v in slices(events, HANDOFF).items()}
    if key == "all_reduce" and all(close(got[r][key], handoff.get(r, 0.0), atol=ATOL)
                                   for r in want):
        return (f"you timed the {HANDOFF!r} slices: the Python thread only hands each bucket "
                f"to gloo there and goes on. The all-reduce itself runs on gloo's threads, as "
                f"the {SLICE!r} slices.")
    if key == "waiting" and not any(got[r]["waiting"] for r in want):
        waiter = max(want, key=lambda r: want[r]["waiting"])
        return (f"you found no waiting at all, but rank {waiter} spent "
                f"{want[waiter]['waiting'] * 1e3:.0f} ms of its all-reduces waiting for the "
                "last rank: within the same all-reduce on every rank (the k-th slice of each), a "
                "rank waits from its own start until the LAST rank's start.")
    if key == "waiting" and _matches(got, _minus_least(got), ["waiting"]):
        least = min(want, key=lambda r: got[r]["all_reduce"])
        return (f"you took each rank's all-reduce time minus the least of any rank as its "
                f"waiting, so rank {least} waited 0; in this run it waited "
                f"{want[least]['waiting'] * 1e3:.1f} ms. Every rank, the quickest included, waits "
                "inside an all-reduce until the last rank starts it, and the ranks' totals also "
                "differ by what they spend moving data. Split each all-reduce (the k-th slice "
                "of every rank) at the last rank's start.")
    if _matches(got, all_reduce_waits(events, split="first"), ["waiting"]):
        return ("you gave the waiting to the ranks that started the all-reduces LATE: a rank "
                "waits from its own start until the LAST rank's start, not from the first "
                "rank's start until its own.")
    return (f"rank {rank}'s {key} is {float(got[rank][key]):.4f} s, the truth "
            f"{want[rank][key]:.4f} s: all_reduce is the time its {SLICE!r} slices cover; "
            "waiting, within each all-reduce (the k-th slice of every rank), is from this "
            "rank's start to the last rank's start.")


def _minus_least(got: dict) -> dict:
    """A rank's waiting as its all-reduce time minus the least of any rank (a mistake)."""
    least = min(parts["all_reduce"] for parts in got.values())
    return {r: {"waiting": parts["all_reduce"] - least} for r, parts in got.items()}


def _matches(got: dict, other: dict, keys: list[str]) -> bool:
    return all(close(got[r][k], other[r][k], atol=ATOL) for r in other for k in keys)


def _shape_hint(got: Any, ranks: list[int]) -> str | None:
    if not isinstance(got, dict) or sorted(got) != ranks:
        keys = sorted(got) if isinstance(got, dict) else type(got).__name__
        return (f"return a dict with one entry per rank {ranks}, got {keys}: "
                "{rank: {'all_reduce': s, 'waiting': s}}.")
    for rank in ranks:
        parts = got[rank]
        if not isinstance(parts, dict) or set(parts) != set(KEYS):
            return (f"rank {rank}'s entry must be a dict with the keys {list(KEYS)}, got "
                    f"{sorted(parts) if isinstance(parts, dict) else parts!r}.")
        if not all(isinstance(v, numbers.Real) for v in parts.values()):
            return f"rank {rank}'s values must be numbers of seconds, got {parts!r}."
    return None

