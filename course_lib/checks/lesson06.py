"""Check for lesson 06's exercise: from a run's telemetry, report each rank's compute, data,
communication and waiting time. The check records real runs (one with all ranks alike, two
with a straggler) at two world sizes and compares with the breakdown it computes itself."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.checks.common import (
    CHECK_TIMEOUT,
    Rejected,
    at_world_sizes,
    close,
    run_check,
)
from course_lib.checks.result import CheckResult
from course_lib.teach.buckets import timed_backward
from course_lib.teach.profiling import COMPUTE, DATA, collectives, covered, time_breakdown
from course_lib.telemetry import Recorder, Telemetry

KEYS = ("compute", "data", "communication", "wait")
# Per world size, the runs recorded: the straggler rank (None: all ranks alike). The
# straggler sleeps SLOW_S per batch, the others FAST_S: far apart, so that waiting shows.
RUNS = {2: (None, 1), 3: (0,)}
FAST_S, SLOW_S = 0.002, 0.03
STEPS = 5
ATOL = 1e-6  # seconds: sums in another order differ by far less; a mistake by far more


# -- on the ranks: record runs ----------------------------------------------------------------

def _record_runs(fn: Callable, slow_ranks: tuple[int | None, ...]) -> list[dict[str, Any]]:
    """Train a small DDP model once per straggler setting; this rank's records of each run."""
    return [_record_run(slow) for slow in slow_ranks]


def _record_run(slow_rank: int | None) -> dict[str, Any]:
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)),
                bucket_cap_mb=0.25)  # several buckets, in flight together at times
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder()
    rec.watch_ddp(model, grads=False)
    pause = SLOW_S if dist.get_rank() == slow_rank else FAST_S
    for step in range(STEPS):
        with rec.step(step):
            with rec.span("data"):
                time.sleep(pause)  # a data loader: slower on the straggler
                x = torch.randn(16, 256)
            with rec.span("forward"):
                loss = model(x).square().mean()
            timed_backward(rec, model, loss)
            with rec.span("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
    return rec.export()


# -- in the kernel: judge ---------------------------------------------------------------------

def check_time_breakdown(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn(tel) must return {rank: {"compute", "data", "communication", "wait": seconds}}."""
    def judge() -> str:
        judged = []
        runs = at_world_sizes(_record_runs, fn, tuple(RUNS), args=lambda n: (RUNS[n],),
                              timeout=timeout)
        for n, ranks in runs:
            for i, slow in enumerate(RUNS[n]):
                tel = Telemetry.from_payloads([records[i] for records in ranks])
                got = _call(fn, tel)
                hint = _hint(got, tel)
                if hint:
                    raise Rejected(f"{_run_name(n, slow)}: {hint}")
                judged.append(_run_name(n, slow))
        return (f"{'; '.join(judged)}: every rank's compute, data, communication and wait "
                "match the truth.")
    return run_check("check_time_breakdown", fn, judge)


def _run_name(n: int, slow: int | None) -> str:
    if slow is None:
        return f"on {n} ranks loading data at the same speed"
    return f"on {n} ranks where rank {slow} loads its data {SLOW_S * 1e3:.0f} ms per step slower"


def _call(fn: Callable, tel: Telemetry) -> Any:
    name = getattr(fn, "__name__", "your function")
    try:
        return fn(tel)
    except NotImplementedError:
        raise NotImplementedError(
            f"{name}() is not written yet: replace its TODO with your code, run that cell, "
            "then run this check again.") from None
    except Exception as error:  # noqa: BLE001 - the learner's error becomes the hint
        raise Rejected(f"{name}(tel) raised {type(error).__name__}: {error}") from None


def _hint(got: Any, tel: Telemetry) -> str | None:
    """None when `got` matches the truth, else what this answer did."""
    shape = _shape_hint(got, tel.ranks)
    if shape:
        return shape
    want = time_breakdown(tel)
    wrong = [(r, k) for r in tel.ranks for k in KEYS if not close(got[r][k], want[r][k], atol=ATOL)]
    if not wrong:
        return None
    rank, key = wrong[0]
    value, true = float(got[rank][key]), want[rank][key]
    if true and close(value, true * 1e3, atol=ATOL * 1e3):
        return f"rank {rank}'s {key} is {value:.4g}: that is milliseconds; report seconds."
    if all(close(got[r][key], want[0][key], atol=ATOL) for r in tel.ranks) and rank != 0:
        return (f"every rank got rank 0's {key} ({want[0][key]:.4f} s): take each rank's own "
                f"rows (tel.spans.where(rank=r), tel.comms.where(rank=r)).")
    if key in ("compute", "data"):
        return _span_hint(tel, rank, key, value, true)
    return _collective_hint(tel, got, want, rank, key)


def _shape_hint(got: Any, ranks: list[int]) -> str | None:
    if not isinstance(got, dict) or sorted(got) != ranks:
        keys = sorted(got) if isinstance(got, dict) else type(got).__name__
        return (f"return a dict with one entry per rank {ranks}, got {keys}: "
                "{rank: {'compute': s, 'data': s, 'communication': s, 'wait': s}}.")
    for rank in ranks:
        parts = got[rank]
        if not isinstance(parts, dict) or set(parts) != set(KEYS):
            return (f"rank {rank}'s entry must be a dict with the keys {list(KEYS)}, got "
                    f"{sorted(parts) if isinstance(parts, dict) else parts!r}.")
        if not all(isinstance(v, (int, float)) or _number(v) for v in parts.values()):
            return f"rank {rank}'s values must be numbers of seconds, got {parts!r}."
    return None


def _number(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def _span_seconds(tel: Telemetry, rank: int, names: tuple[str, ...]) -> float:
    spans = tel.spans.where(rank=rank)
    keep = [n in names for n in spans["name"].tolist()]
    return float((spans["end"] - spans["start"])[keep].sum())


def _span_hint(tel: Telemetry, rank: int, key: str, value: float, true: float) -> str:
    names = COMPUTE if key == "compute" else (DATA,)
    for extra, why in (("wait for all-reduce", "the time backward() waited for the "
                        "all-reduces, not computing"),
                       ("step", "the span around the whole step, which holds all the others"),
                       (DATA, "waiting for the next batch, not computing")):
        if extra not in names and close(value, _span_seconds(tel, rank, (*names, extra)),
                                        atol=ATOL):
            return f"rank {rank}'s {key} includes the '{extra}' spans: that is {why}."
    which = ", ".join(repr(n) for n in names)
    return (f"rank {rank}'s {key} is {value:.4f} s, but its {which} spans add up to "
            f"{true:.4f} s: sum end - start of those spans, every step.")


def _collective_hint(tel: Telemetry, got: dict, want: dict, rank: int, key: str) -> str:
    inside = {r: want[r]["wait"] + want[r]["communication"] for r in tel.ranks}
    waiter = max(tel.ranks, key=lambda r: want[r]["wait"])
    if all(close(got[r]["communication"], inside[r], atol=ATOL) for r in tel.ranks):
        return (f"you counted all the time inside the all-reduces as communication; rank "
                f"{waiter} spent {want[waiter]['wait'] * 1e3:.0f} ms of it waiting for the last "
                "rank to call them. Split each all-reduce at the moment the LAST rank called it "
                "(the largest start among the ranks): before it is wait, after it communication.")
    if _matches(got, _alternative(tel, "sum"), tel.ranks):
        return (f"rank {rank}'s {key} {got[rank][key] * 1e3:.1f} ms counts twice the moments "
                "when two buckets' all-reduces were in flight together (truth: "
                f"{want[rank][key] * 1e3:.1f} ms): measure the union of the intervals, "
                "not the sum of their lengths.")
    if _matches(got, _alternative(tel, "first"), tel.ranks):
        return ("you gave the wait to the ranks that called the all-reduces LATE: a rank waits "
                "from its own start until the LAST rank's start, not from the first rank's "
                "start until its own.")
    return (f"rank {rank}'s {key} is {float(got[rank][key]):.4f} s, the truth "
            f"{want[rank][key]:.4f} s: within each all-reduce (same step and bucket on every "
            "rank), wait is from this rank's start to the last rank's start, communication "
            "from there to this rank's end.")


def _matches(got: dict, other: dict, ranks: list[int]) -> bool:
    return all(close(got[r][k], other[r][k], atol=ATOL) for r in ranks
               for k in ("wait", "communication"))


def _alternative(tel: Telemetry, mistake: str) -> dict[int, dict[str, float]]:
    """Wait and communication as two plausible mistakes compute them: "sum" adds the lengths
    (no union), "first" counts a rank's wait from the first rank's start to its own."""
    inside: dict[int, list] = {r: [] for r in tel.ranks}
    waiting: dict[int, list] = {r: [] for r in tel.ranks}
    for rows in collectives(tel.comms).values():
        first, last = min(s for _, s, _ in rows), max(s for _, s, _ in rows)
        for rank, start, end in rows:
            inside[rank].append((start, end))
            waiting[rank].append((start, min(last, end)) if mistake == "sum" else (first, start))
    measure = covered if mistake == "first" else (lambda iv: sum(e - s for s, e in iv))
    return {r: {"wait": measure(waiting[r]),
                "communication": measure(inside[r]) - measure(waiting[r])} for r in tel.ranks}
