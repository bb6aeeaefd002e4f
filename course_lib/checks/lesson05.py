"""Checks for lesson 05's exercises: the global batch statistics SyncBatchNorm needs, and an
evaluation that rank 0 can run on its own without hanging."""

from __future__ import annotations

import copy
import numbers
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, on_ranks, run_check
from course_lib.checks.result import CheckResult

STATS_SIZES = (2, 5, 3)  # rows per rank: unequal, so a plain average of averages is wrong
CHANNELS = 3
SEED = 5
EVAL_WORLD_SIZE = 2
EVAL_PG_TIMEOUT = 2.0  # seconds a collective waits before it fails: a hang ends fast


# -- global_batch_stats(x) -> (mean, var) over every rank's rows -----------------------------

def rank_rows(rank: int, sizes: tuple[int, ...] = STATS_SIZES) -> torch.Tensor:
    """Rank `rank`'s rows: each rank's rows centred elsewhere, with its own spread."""
    gen = torch.Generator().manual_seed(SEED + rank)
    shift = torch.tensor([1.0, -2.0, 4.0]) * (rank + 1)
    return torch.randn(sizes[rank], CHANNELS, generator=gen) * (1 + rank) + shift


def true_stats(sizes: tuple[int, ...] = STATS_SIZES) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.cat([rank_rows(r, sizes) for r in range(len(sizes))])
    return x.mean(0), x.var(0, unbiased=False)


def _stats_on_rank(fn: Callable) -> Any:
    out = fn(rank_rows(dist.get_rank()))
    if isinstance(out, (tuple, list)) and len(out) == 2:
        return tuple(torch.as_tensor(v).detach().cpu().to(torch.float64)
                     if isinstance(v, (torch.Tensor, list, tuple)) else v for v in out)
    return out


def check_global_batch_stats(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn(x), given this rank's rows x of shape (N, C), must return on every rank the
    per-channel (mean, biased variance) of all ranks' rows together."""
    def judge() -> str:
        results = on_ranks(_stats_on_rank, fn, len(STATS_SIZES), timeout=timeout)
        _judge_stats(results)
        return (f"on {len(STATS_SIZES)} ranks with {', '.join(map(str, STATS_SIZES))} rows, "
                "every rank returned the mean and variance of all rows together.")
    return run_check("check_global_batch_stats", fn, judge)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-5)


def _judge_stats(results: list[Any]) -> None:
    mean, var = true_stats()
    n = len(results)
    for rank, got in enumerate(results):
        if not (isinstance(got, tuple) and len(got) == 2
                and all(isinstance(v, torch.Tensor) for v in got)):
            raise Rejected(f"rank {rank} returned {got!r}; return (mean, var), two tensors of "
                           f"{CHANNELS} values, one per channel.")
        if got[0].shape != (CHANNELS,) or got[1].shape != (CHANNELS,):
            raise Rejected(f"rank {rank} returned shapes {list(got[0].shape)} and "
                           f"{list(got[1].shape)}; each statistic has one value per channel: "
                           f"[{CHANNELS}] (reduce over dimension 0, the rows).")
    right = [_close(m, mean) and _close(v, var) for m, v in results]
    if right[0] and not all(right):
        raise Rejected(f"only rank 0 got the global statistics; rank {right.index(False)} "
                       "did not. Every rank normalises its rows, so every rank needs them: "
                       "all_reduce (to every rank), not reduce (to one).")
    for rank, (got_mean, got_var) in enumerate(results):
        if right[rank]:
            continue
        own = rank_rows(rank)
        if _close(got_mean, own.mean(0)) and _close(got_var, own.var(0, unbiased=False)):
            raise Rejected(f"rank {rank} returned the statistics of its own {len(own)} rows: "
                           "the ranks never combined them. all_reduce per-channel sums and the "
                           "row count, then divide.")
        if not _close(got_mean, mean):
            rows = [rank_rows(r) for r in range(n)]
            if _close(got_mean, sum(r.mean(0) for r in rows) / n):
                raise Rejected(f"rank {rank}'s mean is the plain average of the ranks' own "
                               f"means, but the ranks hold {', '.join(map(str, STATS_SIZES))} "
                               "rows: all_reduce the sums and the counts, and divide once.")
            raise Rejected(f"rank {rank}'s mean {_fmt(got_mean)} is not the mean of all rows "
                           f"{_fmt(mean)}.")
        if _close(got_var, var * sum(STATS_SIZES) / (sum(STATS_SIZES) - 1)):
            raise Rejected("the variance is the unbiased one (divided by N - 1): BatchNorm "
                           "normalises with the biased variance, the mean of squared "
                           "deviations (divide by N).")
        raise Rejected(f"the mean is right, but rank {rank}'s variance {_fmt(got_var)} is not "
                       f"the variance of all rows {_fmt(var)}: averaging the ranks' variances "
                       "misses how far apart their means are. all_reduce the sum of squares "
                       "too: var = mean of x**2 - mean**2.")


def _fmt(t: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in t.tolist()) + "]"


# -- evaluate(model, x, y) -> accuracy, called on rank 0 only --------------------------------

def net_with_batchnorm() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def eval_set() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED + 100)
    return torch.randn(64, 4, generator=gen) * 2 + 1, torch.randint(0, 3, (64,), generator=gen)


def _accuracy(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return (module(x).argmax(1) == y).float().mean().item()


def _evaluate_on_rank(fn: Callable) -> dict[str, Any] | None:
    model = DDP(net_with_batchnorm())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(SEED + dist.get_rank())
    for _ in range(3):  # training forwards: the next forward through the wrapper broadcasts
        x, y = torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    report = None
    if dist.get_rank() == 0:
        x, y = eval_set()
        reference = copy.deepcopy(model.module).eval()
        with torch.no_grad():
            want = _accuracy(reference, x, y)
        buffers = [b.clone() for b in model.module.buffers()]
        got = fn(model, x, y)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        report = {"got": got, "want": want, "training": model.training and model.module.training,
                  "buffers_kept": all(torch.equal(a, b) for a, b in
                                      zip(buffers, model.module.buffers()))}
    dist.barrier()  # the other ranks wait for rank 0's evaluation
    return report


EVAL_ERRORS = (
    ("_sync_buffers",
     "rank 0 never came back from your evaluate(): its forward through the DDP wrapper "
     "started a broadcast of the BatchNorm buffers (DDP's _sync_buffers), a collective the "
     "other rank, waiting at the barrier, never joined. Evaluate through model.module."),
)


def check_evaluate(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """After DDP training, rank 0 alone calls fn(ddp_model, x, y) while the other rank waits
    at a barrier: it must return the eval-mode accuracy, without hanging, and leave the
    model in training mode with its running statistics unchanged."""
    def judge() -> str:
        results = on_ranks(_evaluate_on_rank, fn, EVAL_WORLD_SIZE, timeout=timeout,
                               pg_timeout=EVAL_PG_TIMEOUT, known=EVAL_ERRORS)
        want = _judge_evaluate(results[0])
        return (f"rank 0 evaluated on its own (accuracy {want:.3f}, as in eval mode) while "
                "rank 1 waited, and the model went back to training unchanged.")
    return run_check("check_evaluate", fn, judge)


def _judge_evaluate(report: dict[str, Any]) -> float:
    got, want = report["got"], report["want"]
    if not isinstance(got, numbers.Real) or isinstance(got, bool):
        raise Rejected(f"evaluate() returned {got!r}; return the accuracy, a number between 0 "
                       "and 1 (e.g. tensor.item()).")
    if not report["buffers_kept"]:
        raise Rejected("evaluate() changed BatchNorm's running statistics: the model was in "
                       "training mode, so BatchNorm normalised with the evaluation batch's own "
                       "statistics and updated its running ones. Call .eval() first.")
    if abs(got - want) > 1e-6:
        raise Rejected(f"evaluate() returned {got:.4f}, but the eval-mode accuracy is "
                       f"{want:.4f}: compute the share of rows whose largest output (argmax) "
                       "is the label, with the model in eval mode.")
    if not report["training"]:
        raise Rejected("after evaluate() the model is still in eval mode: the next training "
                       "steps would use the running statistics and skip dropout. Call "
                       ".train() before returning.")
    return want
