"""Checks for lesson 00's exercises: who am I (rank, world size), a global sum, and random
numbers every rank agrees on. Both run at two world sizes, compare with the true values, and
word their hints from what the answer did: its values and the collectives it called."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from course_lib.checks import collectives
from course_lib.checks.common import (
    CHECK_TIMEOUT,
    WORLD_SIZES,
    Rejected,
    at_world_sizes,
    check,
    close,
)
from course_lib.words import listing

RANDOM_COUNT = 8
RANDOM_SEEDS = {2: 2024, 3: 77}  # per world size: a fixed-seed answer returns the same both times
DRAWS_SEARCHED = 3  # an answer may draw a few times before the numbers it returns


# -- rank_summary(x) -> (rank, world_size, total) -------------------------------------------

def summary_values(world_size: int) -> list[float]:
    """The x each rank gets: different per rank and per world size, so only a collective
    can know the total."""
    return [round(1.25 + 2.5 * r + 0.375 * world_size, 3) for r in range(world_size)]


def _summary_on_rank(fn: Callable, values: list[float]) -> tuple[Any, int]:
    with collectives.recorded() as calls:
        got = fn(values[dist.get_rank()])
    return got, collectives.count(calls)


@check
def check_rank_summary(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """Run fn(x) on 2 and then 3 ranks, each with its own x; every rank must return
    (its rank, the world size, the sum of all ranks' x)."""
    for _, results in at_world_sizes(_summary_on_rank, fn, WORLD_SIZES,
                                     args=lambda n: (summary_values(n),), timeout=timeout):
        _judge_summary(results)
    values = summary_values(WORLD_SIZES[-1])
    return (f"correct on {listing(WORLD_SIZES)} ranks (with x = {values} every rank "
            f"reported total {sum(values):g}).")


def _judge_summary(results: list[tuple[Any, int]]) -> None:
    n = len(results)
    values = summary_values(n)
    triples = [_triple(rank, got) for rank, (got, _) in enumerate(results)]
    for rank, (got_rank, got_world, _) in enumerate(triples):
        if got_rank != rank:
            raise Rejected(f"with {n} ranks, rank {rank} reported rank={got_rank!r}: ask "
                           "dist.get_rank().")
        if got_world != n:
            raise Rejected(f"with {n} ranks, rank {rank} reported world_size={got_world!r}: "
                           "ask dist.get_world_size() rather than writing a number.")
    _judge_totals([t for _, _, t in triples], values, [c for _, c in results])


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


def _judge_totals(totals: list[float], values: list[float], calls: list[int]) -> None:
    n, want = len(values), sum(values)
    if all(close(t, want) for t in totals):
        return
    if all(close(t, v) for t, v in zip(totals, values)):
        if any(calls):
            raise Rejected(f"with {n} ranks, each rank returned its own x as the total "
                           f"({totals}), although it called a collective: the sum went into a "
                           "tensor that was not returned. Return the reduced tensor's value, "
                           "total.item().")
        raise Rejected(f"with {n} ranks, each rank returned its own x as the total ({totals}) "
                       "and no rank called a collective: the ranks never combined their "
                       "values. Put x in a tensor and dist.all_reduce it.")
    if close(totals[0], want):
        raise Rejected(f"with {n} ranks, only rank 0 has the right total ({want:g}); the others "
                       f"reported {totals[1:]}. dist.reduce delivers the sum to one rank only: "
                       "dist.all_reduce gives it to every rank.")
    if all(close(t, want / n) for t in totals):
        raise Rejected(f"with {n} ranks, every rank reported {want / n:g}, the average: the "
                       "total is the sum (all_reduce's default op is SUM; do not divide).")
    raise Rejected(f"with {n} ranks and x = {values}, the ranks reported totals {totals}; "
                   f"expected {want:g} on every rank.")


# -- same_random(n) -> n random numbers, equal on every rank ------------------------------

def _random_on_rank(fn: Callable, n: int, seed: int) -> tuple[Any, dict[str, int]]:
    torch.manual_seed(seed + dist.get_rank())  # as a job that seeds each rank differently
    with collectives.recorded() as calls:
        out = fn(n)
    returned = collectives.storage_of(out)
    done = {"broadcast": collectives.count(calls, "broadcast"),
            "all_reduce": collectives.count(calls, "all_reduce"),
            "on_returned": sum(1 for c in calls if returned and c.storage == returned)}
    return (out.tolist() if isinstance(out, torch.Tensor) else out), done


def own_draws(n: int, seed: int, world_size: int, draws: int = 1,
              dtype: torch.dtype = torch.float32) -> list[list[list[float]]]:
    """Per rank, the first `draws` tensors of n numbers its generator gives when the ranks
    do not coordinate."""
    per_rank = []
    for rank in range(world_size):
        gen = torch.Generator().manual_seed(seed + rank)
        stream = torch.rand(n * draws, generator=gen, dtype=dtype)
        per_rank.append([stream[k * n:(k + 1) * n].tolist() for k in range(draws)])
    return per_rank


@check
def check_same_random(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """Run fn(n) on 2 and on 3 ranks whose generators are seeded differently: every rank must
    return the same n numbers drawn with torch.rand: one rank's draw, or a draw from a seed
    that every rank shares."""
    agreed = {}
    for n, results in at_world_sizes(_random_on_rank, fn, tuple(RANDOM_SEEDS),
                                     args=lambda n: (RANDOM_COUNT, RANDOM_SEEDS[n]),
                                     timeout=timeout):
        agreed[n] = _judge_random(results, RANDOM_SEEDS[n])
    return _judge_source(agreed)


def _judge_random(results: list[tuple[Any, dict[str, int]]], seed: int) -> list[float]:
    """The numbers every rank returned, once they agree and lie in [0, 1)."""
    n = len(results)
    rows = [_numbers(rank, got, RANDOM_COUNT) for rank, (got, _) in enumerate(results)]
    done = [d for _, d in results]
    for rank, row in enumerate(rows[1:], start=1):
        if row != rows[0]:
            raise Rejected(_disagree_hint(rank, n, rows, done, seed))
    if any(v < 0 for v in rows[0]):
        raise Rejected(f"with {n} ranks, the numbers {_shown(rows[0])} include negative "
                       "ones: torch.randn draws from a normal distribution; use torch.rand, "
                       "which draws in [0, 1).")
    if not all(v < 1 for v in rows[0]):
        why = (" Your ranks called all_reduce, which adds the ranks' numbers: copy one rank's "
               "with dist.broadcast instead." if done[0]["all_reduce"] else "")
        raise Rejected(f"with {n} ranks, the numbers {_shown(rows[0])} leave [0, 1), where "
                       f"torch.rand draws.{why}")
    if len(set(rows[0])) == 1:
        raise Rejected(f"all {RANDOM_COUNT} numbers equal {rows[0][0]}: they should be random "
                       "draws.")
    return rows[0]


def _disagree_hint(rank: int, n: int, rows: list[list[float]], done: list[dict[str, int]],
                   seed: int) -> str:
    own = [draws[0] for draws in own_draws(RANDOM_COUNT, seed, n)]
    start = f"with {n} ranks, ranks 0 and {rank} returned different numbers."
    if done[0]["broadcast"] and not done[0]["on_returned"]:
        return (f"{start} Every rank called broadcast, but on another tensor than the one it "
                "returned (a copy): broadcast the tensor you return, in place.")
    if not any(d["broadcast"] + d["all_reduce"] for d in done):
        mine = " Each rank returned its own draw." if rows == own else ""
        return (f"{start}{mine} No rank called a collective, and each rank's generator is "
                "seeded differently: draw on every rank, then dist.broadcast(numbers, src=0); "
                "or draw from a generator seeded alike on every rank.")
    return (f"{start} Every rank must end with the very same tensor: dist.broadcast(numbers, "
            "src=0) on every rank, then return numbers.")


def _judge_source(agreed: dict[int, list[float]]) -> str:
    """Accept one rank's own draw (a broadcast) or the same numbers at both world sizes (a
    shared seed); name what else the numbers are."""
    for n, row in agreed.items():
        per_rank = [draws for dtype in (torch.float32, torch.float64)
                    for draws in own_draws(RANDOM_COUNT, RANDOM_SEEDS[n], n, DRAWS_SEARCHED, dtype)]
        if not any(_equal(row, draw) for draws in per_rank for draw in draws):
            break
    else:
        return (f"on {listing(agreed)} ranks, seeded differently, every rank returned the same "
                f"{RANDOM_COUNT} numbers: one rank's draw, shared.")
    rows = list(agreed.values())
    if all(_equal(row, rows[0]) for row in rows[1:]):
        return (f"on {listing(agreed)} ranks, seeded differently, every rank returned the same "
                f"{RANDOM_COUNT} numbers: drawn from a seed every rank shares.")
    first = [draws[0] for draws in own_draws(RANDOM_COUNT, RANDOM_SEEDS[n], n)]
    combined = {"the average": torch.tensor(first).mean(0),
                "the largest": torch.tensor(first).amax(0)}
    for name, values in combined.items():
        if _equal(row, values.tolist()):
            raise Rejected(f"with {n} ranks the ranks agree, but on {name} of their draws "
                           "(an all_reduce): each rank must hold one rank's draw. Copy rank "
                           "0's with dist.broadcast(numbers, src=0).")
    raise Rejected(f"with {n} ranks the ranks agree on {_shown(row)}, but that is no rank's "
                   "draw, and it changed with the ranks' seeds: broadcast one rank's draw "
                   "(dist.broadcast(numbers, src=0)), or draw from a seed every rank shares.")


def _equal(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))


def _shown(row: list[float]) -> list[float]:
    return [round(v, 3) for v in row]


def _numbers(rank: int, got: Any, n: int) -> list[float]:
    try:
        row = [float(v) for v in got]
    except (TypeError, ValueError):
        raise Rejected(f"rank {rank} returned {got!r}; return a tensor of {n} numbers.") from None
    if len(row) != n:
        raise Rejected(f"rank {rank} returned {len(row)} numbers; same_random({n}) must "
                       f"return {n}.")
    return row
