"""Checks for lesson 00's exercises: who am I (rank, world size), a global sum, and random
numbers every rank agrees on."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, close, on_ranks, run_check
from course_lib.checks.result import CheckResult

SUMMARY_WORLD_SIZES = (2, 3)
RANDOM_WORLD_SIZE = 3
RANDOM_COUNT = 8
RANDOM_SEED = 2024


# -- rank_summary(x) -> (rank, world_size, total) -------------------------------------------

def summary_values(world_size: int) -> list[float]:
    """The x each rank gets: different per rank, so only a collective can know the total."""
    return [round(1.25 + 2.5 * r + 0.375 * world_size, 3) for r in range(world_size)]


def _summary_on_rank(fn: Callable, values: list[float]) -> Any:
    return fn(values[dist.get_rank()])


def check_rank_summary(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Run fn(x) on 2 and then 3 ranks, each with its own x; every rank must return
    (its rank, the world size, the sum of all ranks' x)."""
    def judge() -> str:
        for n in SUMMARY_WORLD_SIZES:
            values = summary_values(n)
            _judge_summary(on_ranks(_summary_on_rank, fn, n, (values,), timeout), values)
        values = summary_values(SUMMARY_WORLD_SIZES[-1])
        return (f"correct on {' and '.join(map(str, SUMMARY_WORLD_SIZES))} ranks "
                f"(with x = {values} every rank reported total {sum(values):g}).")
    return run_check("check_rank_summary", fn, judge)


def _judge_summary(results: list[Any], values: list[float]) -> None:
    n = len(values)
    triples = [_triple(rank, got) for rank, got in enumerate(results)]
    for rank, (got_rank, got_world, _) in enumerate(triples):
        if got_rank != rank:
            raise Rejected(f"rank {rank} reported rank={got_rank!r}: ask dist.get_rank().")
        if got_world != n:
            raise Rejected(f"with {n} ranks, rank {rank} reported world_size={got_world!r}: "
                           "ask dist.get_world_size() rather than writing a number.")
    _judge_totals([t for _, _, t in triples], values)


def _triple(rank: int, got: Any) -> tuple[Any, Any, float]:
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise Rejected(f"rank {rank} returned {got!r}; return (rank, world_size, total).")
    got_rank, got_world, total = got
    for name, value in (("rank", got_rank), ("world_size", got_world)):
        if not isinstance(value, numbers.Integral):
            raise Rejected(f"rank {rank} returned {name}={value!r}, a "
                           f"{type(value).__name__}; return an int (environment variables are "
                           "strings: use dist.get_rank() and dist.get_world_size()).")
    try:
        return int(got_rank), int(got_world), float(total)
    except (TypeError, ValueError, RuntimeError):
        raise Rejected(f"rank {rank} returned total={total!r}, which is not a number.") from None


def _judge_totals(totals: list[float], values: list[float]) -> None:
    n, want = len(values), sum(values)
    if all(close(t, want) for t in totals):
        return
    if all(close(t, v) for t, v in zip(totals, values)):
        raise Rejected(f"each rank returned its own x as the total ({totals}): the ranks never "
                       "combined their values. Put x in a tensor and dist.all_reduce it.")
    if close(totals[0], want):
        raise Rejected(f"only rank 0 has the right total ({want:g}); the others reported "
                       f"{totals[1:]}. dist.reduce delivers the sum to one rank only: "
                       "dist.all_reduce gives it to every rank.")
    if all(close(t, want / n) for t in totals):
        raise Rejected(f"every rank reported {want / n:g}, the average: the total is the sum "
                       "(all_reduce's default op is SUM; do not divide).")
    raise Rejected(f"with {n} ranks and x = {values}, the ranks reported totals {totals}; "
                   f"expected {want:g} on every rank.")


# -- same_random(n) -> n random numbers, equal on every rank ------------------------------

def _random_on_rank(fn: Callable, n: int, seed: int) -> Any:
    torch.manual_seed(seed + dist.get_rank())  # as a job that seeds each rank differently
    out = fn(n)
    return out.tolist() if isinstance(out, torch.Tensor) else out


def own_draws(n: int, seed: int, world_size: int) -> list[list[float]]:
    """What each rank's generator gives when the ranks do not coordinate."""
    draws = []
    for rank in range(world_size):
        gen = torch.Generator().manual_seed(seed + rank)
        draws.append(torch.rand(n, generator=gen).tolist())
    return draws


def check_same_random(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Run fn(n) on ranks whose random generators are seeded differently: each must return
    the same n numbers in [0, 1), and they must not all be equal."""
    def judge() -> str:
        results = on_ranks(_random_on_rank, fn, RANDOM_WORLD_SIZE, (RANDOM_COUNT, RANDOM_SEED),
                           timeout)
        _judge_random(results, RANDOM_COUNT)
        return (f"all {RANDOM_WORLD_SIZE} ranks returned the same {RANDOM_COUNT} random numbers, "
                "although each rank's generator was seeded differently.")
    return run_check("check_same_random", fn, judge)


def _judge_random(results: list[Any], n: int) -> None:
    rows = [_numbers(rank, got, n) for rank, got in enumerate(results)]
    for rank, row in enumerate(rows[1:], start=1):
        if row != rows[0]:
            mine = own_draws(n, RANDOM_SEED, len(rows))
            why = (" Each rank returned its own draw: the generators are seeded differently."
                   if rows == mine else "")
            raise Rejected(f"ranks 0 and {rank} returned different numbers.{why} Draw on rank "
                           "0 and dist.broadcast the tensor, or seed every rank alike first.")
    if not all(0 <= v < 1 for v in rows[0]):
        shown = [round(v, 3) for v in rows[0]]
        raise Rejected(f"the numbers {shown} leave [0, 1), where torch.rand draws: did you "
                       "add the ranks' numbers (all_reduce) instead of copying one rank's "
                       "(broadcast)?")
    if len(set(rows[0])) == 1:
        raise Rejected(f"all {n} numbers equal {rows[0][0]}: they should be random draws.")


def _numbers(rank: int, got: Any, n: int) -> list[float]:
    try:
        row = [float(v) for v in got]
    except (TypeError, ValueError):
        raise Rejected(f"rank {rank} returned {got!r}; return a tensor of {n} numbers.") from None
    if len(row) != n:
        raise Rejected(f"rank {rank} returned {len(row)} numbers; same_random({n}) must "
                       f"return {n}.")
    return row
