"""Check for lesson 10's second exercise: skip a batch whose loss is not finite (NaN) on one
rank, on every rank together. The lesson fixed a decision to stop; this is the same rule on a
decision the lesson did not fix, so an answer that copies the lesson's cell does not pass."""

from __future__ import annotations

import numbers
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.checks.common import (
    CHECK_TIMEOUT,
    Failure,
    Rejected,
    at_world_sizes,
    check,
    differing,
    explain,
    state_snapshot,
)
from course_lib.checks.lesson10.parting import time_limit_note, where_parted
from course_lib.words import listing, ranks

WORLD_SIZES = (2, 3)
SEED = 1010
STEPS, BATCH, LR = 10, 16, 0.1
HANG_AFTER_S = 4.0  # a hang ends in seconds, not in gloo's default 30 minutes
TRUE_W = (1.0, -2.0, 0.5, 3.0)


def bad_batches(world_size: int) -> list[tuple[int, int]]:
    """(rank, batch index) of the corrupt batches: the last rank's 4th batch, and at 3 ranks
    or more rank 0's 7th too, so that no single rank or step is always the bad one."""
    return [(world_size - 1, 3)] + ([(0, 6)] if world_size >= 3 else [])


def rank_batches(rank: int, world_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's STEPS batches of y = x @ TRUE_W; a corrupt batch has one NaN label."""
    gen = torch.Generator().manual_seed(SEED * 100 + rank)
    w = torch.tensor(TRUE_W).unsqueeze(1)
    batches = []
    for i in range(STEPS):
        x = torch.randn(BATCH, 4, generator=gen)
        y = x @ w
        if (rank, i) in bad_batches(world_size):
            y[0, 0] = float("nan")
        batches.append((x, y))
    return batches


def _train_on_rank(fn: Callable) -> tuple[Any, dict[str, torch.Tensor]]:
    """fn(ddp_model, this rank's batches) on this rank; its return and the weights."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    model = DDP(nn.Linear(4, 1))
    steps = fn(model, rank_batches(rank, world_size))
    return steps, state_snapshot(model.module)


def simulate(world_size: int, stop_at_first_bad: bool = False,
             ) -> tuple[int, dict[str, torch.Tensor]]:
    """The steps and weights of DDP training that skips, on every rank, each batch where
    some rank's loss is not finite (or stops there), computed in one process: DDP's gradient
    is the gradient of the ranks' mean loss (equal batch sizes). The kernel's random state
    is kept."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    data = [rank_batches(r, world_size) for r in range(world_size)]
    steps = 0
    for i in range(STEPS):
        losses = torch.stack([F.mse_loss(model(d[i][0]), d[i][1]) for d in data])
        if not bool(torch.isfinite(losses).all()):
            if stop_at_first_bad:
                break
            continue
        losses.mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
    return steps, state_snapshot(model)


# -- the check -------------------------------------------------------------------------------

@check
def check_skip_bad_batches(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(model, batches) must train the DDP model on this rank's batches, skipping on every
    rank each batch where some rank's loss is not finite, and return the optimizer steps
    taken. It runs at 2 and 3 ranks, with the corrupt batch on different ranks and steps."""
    for n, results in at_world_sizes(_train_on_rank, fn, WORLD_SIZES, timeout=timeout,
                                     hang_after=HANG_AFTER_S, diagnose=_failure_hint):
        _judge(n, results)
    return (f"on {listing(WORLD_SIZES)} ranks every rank skipped the batches where some "
            "rank's loss was NaN, and only those, with one process's weights: no hang "
            "and no NaN in the model.")


def _judge(n: int, results: list) -> None:
    steps = [s for s, _ in results]
    if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in steps):
        raise Rejected(f"on {n} ranks your function returned {steps!r}: return the number of "
                       "optimizer steps taken, an int.")
    if len(set(steps)) > 1:
        raise Rejected(f"on {n} ranks the ranks report different step counts {steps}: every "
                       "rank must skip the same batches.")
    weights = results[0][1]
    if any(not bool(torch.isfinite(t).all()) for t in weights.values()):
        raise Rejected(_nan_hint(n))
    want_steps, want = simulate(n)
    got = steps[0]
    if got != want_steps:
        raise Rejected(_steps_hint(n, got, want_steps))
    bad = differing(weights, want)
    if bad:
        raise Rejected(f"on {n} ranks you took the right {got} steps, but the weights "
                       f"({listing(bad)}) differ from one process's: on a good batch, "
                       "back-propagate this rank's own loss, unchanged, and step once; DDP "
                       "averages the gradients.")


def _where_bad(n: int) -> str:
    return listing(f"rank {r}'s batch {i}" for r, i in bad_batches(n))


def _nan_hint(n: int) -> str:
    return (f"on {n} ranks the model's weights are NaN after training: a step was taken on a "
            f"batch whose loss was NaN ({_where_bad(n)}), and DDP's all-reduce carried that "
            "rank's NaN gradient to every rank. A check on one rank's own loss (rank 0's, "
            "broadcast) misses another rank's NaN; so does a flag all-reduced with MIN of "
            "'bad' or MAX of 'good'. Skip when ANY rank's loss is not finite.")


def _steps_hint(n: int, got: int, want: int) -> str:
    base = (f"on {n} ranks every rank took {got} steps; skipping only the bad batches "
            f"({_where_bad(n)}) takes {want}.")
    if got == simulate(n, stop_at_first_bad=True)[0]:
        return (f"{base} {got} is where the first bad batch is: training stopped there. Skip "
                "that batch (`continue`, not `break`); and if you skip after backward, zero "
                "the NaN gradients, or every later step is NaN too.")
    if got == STEPS:
        return f"{base} You stepped on every batch: the bad ones too."
    return (f"{base} Skip a batch only when some rank's loss on it is not finite, and count "
            "only the optimizer steps you took.")


# -- a crash or a hang -----------------------------------------------------------------------

def _failure_hint(failure: Failure) -> str | None:
    """What the ranks did differently, from the failed launch's desync report: which ranks
    skipped a backward alone (fewer gradient all-reduces), or where they first parted."""
    report = getattr(failure.error, "desync", None)
    if report is None or not report.traces:
        return None
    n = failure.world_size
    counts = {t.rank: Counter("backward" in c.where for c in t.calls)[True]
              for t in report.traces if t.dumped}
    most = max(counts.values(), default=0)
    fewer = sorted(r for r, c in counts.items() if c < most)
    waited = sorted(r for r, c in counts.items() if c == most)
    if fewer and fewer == sorted({r for r, _ in bad_batches(n)}):
        said = ", ".join(f"rank {r} issued {counts[r]}" for r in sorted(counts))
        return (f"on {n} ranks {ranks(fewer)} skipped alone: the NaN was on "
                f"{_where_bad(n)}, and only there was the backward skipped. Counted, the "
                f"gradient all-reduces (from backward) differ: {said}; so {ranks(waited)} "
                "waited in all_reduce for a partner that never came, until the timeout. "
                "Decide together: share whether this rank's loss is finite with a "
                "collective, and skip on every rank when any rank's is not."
                + time_limit_note(failure))
    parted = where_parted(report)
    if parted is not None:
        return (f"on {n} ranks {parted} Every rank must issue the same collectives, in the "
                "same order, on every batch: share the decision with a collective that every "
                "rank calls, then branch." + time_limit_note(failure))
    return explain(failure) if failure.timed_out else None
