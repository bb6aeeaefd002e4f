"""`check_global_batch_stats` for lesson 05: each rank holds its own number of rows, and the
learner's function must return on every rank the per-channel mean and biased variance of all
ranks' rows together (what SyncBatchNorm needs). It runs at 2 and 4 ranks with unequal rows;
its hints say whether this answer averaged the ranks' means or variances, assumed equal rows,
used the unbiased variance, or reduced to rank 0 only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from course_lib.checks.collectives import recorded
from course_lib.checks.common import CHECK_TIMEOUT, Rejected, at_world_sizes, check, same
from course_lib.words import listing

# Rows per rank at each world size: unequal, so that a plain average of averages, or a
# count taken as len(x) * world_size, is wrong at both sizes.
STATS_SIZES = {2: (6, 3), 4: (2, 5, 3, 4)}
CHANNELS = 3
SEED = 5


def rank_rows(rank: int, sizes: tuple[int, ...]) -> torch.Tensor:
    """Rank `rank`'s rows: each rank's rows centred elsewhere, with its own spread."""
    gen = torch.Generator().manual_seed(SEED + rank)
    shift = torch.tensor([1.0, -2.0, 4.0]) * (rank + 1)
    return torch.randn(sizes[rank], CHANNELS, generator=gen) * (1 + rank) + shift


def all_rows(sizes: tuple[int, ...]) -> torch.Tensor:
    """Every rank's rows together, in float64: what the true statistics are computed from."""
    return torch.cat([rank_rows(r, sizes) for r in range(len(sizes))]).double()


def _stats_on_rank(fn: Callable, sizes: tuple[int, ...]) -> dict[str, Any]:
    """fn(this rank's rows) on a rank: its (mean, var), and the collectives it called (for
    the hint: an answer that called none never combined the ranks' rows)."""
    with recorded() as calls:
        out = fn(rank_rows(dist.get_rank(), sizes))
    if isinstance(out, (tuple, list)) and len(out) == 2:
        out = tuple(v.detach().cpu() if isinstance(v, torch.Tensor) else v for v in out)
    return {"out": out, "calls": [c.op for c in calls if c.op != "barrier"]}


@check
def check_global_batch_stats(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(x), given this rank's rows x of shape (N, C), must return on every rank the
    per-channel (mean, biased variance) of all ranks' rows together."""
    passed: list[int] = []
    runs = at_world_sizes(_stats_on_rank, fn, tuple(STATS_SIZES),
                          args=lambda n: (STATS_SIZES[n],), timeout=timeout)
    for n in STATS_SIZES:
        try:
            _, results = next(runs)
        except Rejected as failed:  # a crash or a hang at this size
            raise Rejected(_where(n, passed) + str(failed), failed.failure,
                           kind=failed.kind) from None
        hint = _stats_hint(results, STATS_SIZES[n])
        if hint:
            raise Rejected(_where(n, passed) + hint)
        passed.append(n)
    cases = "; ".join(f"{n} ranks holding {listing(STATS_SIZES[n])} rows"
                      for n in STATS_SIZES)
    return f"{cases}: every rank returned the mean and variance of all rows together."


def _where(n: int, passed: list[int]) -> str:
    """How a hint starts: the run it describes, and the world sizes that were right."""
    rows = listing(STATS_SIZES[n])
    if passed:
        return (f"right on {listing(passed)} ranks, wrong on {n} (holding {rows} rows): "
                "something in your code assumes the number of ranks or rows; take them from "
                "dist.get_world_size() and the all-reduced count. ")
    return f"on {n} ranks holding {rows} rows, "


def _stats_hint(results: list[dict[str, Any]], sizes: tuple[int, ...]) -> str | None:
    """None when every rank returned the global statistics, else the hint for this run."""
    for rank, result in enumerate(results):
        shape_hint = _shape_hint(rank, result["out"])
        if shape_hint:
            return shape_hint
    x = all_rows(sizes)
    mean, var = x.mean(0), x.var(0, unbiased=False)
    right = [same(r["out"][0], mean) and same(r["out"][1], var) for r in results]
    if all(right):
        return None
    wrong = right.index(False)
    if right[0]:
        return (f"only rank 0 got the global statistics; rank {wrong} did not. Every rank "
                "normalises its rows, so every rank needs them: all_reduce (to every rank), "
                "not reduce (to one).")
    got_mean, got_var = results[wrong]["out"]
    calls = results[wrong]["calls"]
    own = rank_rows(wrong, sizes).double()
    if same(got_mean, own.mean(0)) and same(got_var, own.var(0, unbiased=False)):
        return _own_rows_hint(wrong, len(own), calls)
    if not same(got_mean, mean):
        return _mean_hint(wrong, got_mean, mean, sizes, x)
    n = len(x)
    if same(got_var, var * n / (n - 1)):
        return ("the variance is the unbiased one (divided by N - 1): BatchNorm normalises "
                "with the biased variance, the mean of squared deviations (divide by N).")
    return (f"the mean is right, but rank {wrong}'s variance {_fmt(got_var)} is not the "
            f"variance of all rows {_fmt(var)}: averaging the ranks' variances misses how far "
            "apart their means are. all_reduce the sum of squares too: var = mean of x**2 - "
            "mean**2.")


def _shape_hint(rank: int, got: Any) -> str | None:
    if not (isinstance(got, tuple) and len(got) == 2
            and all(isinstance(v, torch.Tensor) for v in got)):
        return (f"rank {rank} returned {got!r}; return (mean, var), two tensors of "
                f"{CHANNELS} values, one per channel.")
    if got[0].shape != (CHANNELS,) or got[1].shape != (CHANNELS,):
        return (f"rank {rank} returned shapes {list(got[0].shape)} and {list(got[1].shape)}; "
                f"each statistic has one value per channel: [{CHANNELS}] (reduce over "
                "dimension 0, the rows).")
    return None


def _own_rows_hint(rank: int, rows: int, calls: list[str]) -> str:
    said = (f"rank {rank} returned the statistics of its own {rows} rows only")
    if not calls:
        return (f"{said}, and called no collective: the ranks never combined their rows. "
                "all_reduce the per-channel sums and the row count, then divide.")
    return (f"{said}, although it called {listing(sorted(set(calls)))}: the combined result "
            "was not the one your statistics came from. all_reduce works in place on the "
            "tensor you pass it: keep that tensor (not a temporary such as x.sum(0) passed "
            "directly, or a copy), and compute the mean and variance from it.")


def _mean_hint(rank: int, got: torch.Tensor, mean: torch.Tensor, sizes: tuple[int, ...],
               x: torch.Tensor) -> str:
    means = [rank_rows(r, sizes).double().mean(0) for r in range(len(sizes))]
    if same(got, sum(means) / len(sizes)):
        return (f"rank {rank}'s mean is the plain average of the ranks' own means, but the "
                f"ranks hold {listing(sizes)} rows: all_reduce the sums and the counts, and "
                "divide once.")
    assumed = len(sizes) * sizes[rank]
    if same(got, x.sum(0) / assumed):
        return (f"rank {rank}'s mean is the sum of all rows divided by {assumed} (its own "
                f"{sizes[rank]} rows times {len(sizes)} ranks), but the ranks hold "
                f"{listing(sizes)} rows: all_reduce the row count with the sums.")
    return f"rank {rank}'s mean {_fmt(got)} is not the mean of all rows {_fmt(mean)}."


def _fmt(t: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in t.tolist()) + "]"
