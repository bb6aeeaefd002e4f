"""Checks for lesson 05's exercises: the global batch statistics SyncBatchNorm needs, and an
evaluation that rank 0 can run on its own without hanging."""

from __future__ import annotations

import copy
import numbers
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.checks.common import (
    CHECK_TIMEOUT,
    Rejected,
    at_world_sizes,
    listing,
    run_check,
    same,
    state_snapshot,
)
from course_lib.checks.result import CheckResult

# Rows per rank at each world size: unequal, so that a plain average of averages, or a
# count taken as len(x) * world_size, is wrong at both sizes.
STATS_SIZES = {2: (6, 3), 4: (2, 5, 3, 4)}
CHANNELS = 3
SEED = 5
EVAL_WORLD_SIZES = (2, 3)
EVAL_PG_TIMEOUT = 2.0  # seconds a collective waits before it fails: a hang ends fast
# The collectives whose calls a check records on the ranks (to say what an answer did).
COLLECTIVES = ("all_reduce", "reduce", "all_gather", "all_gather_into_tensor",
               "all_gather_object", "broadcast", "reduce_scatter", "all_to_all")


@contextmanager
def recorded_collectives(calls: list[str]):
    """Note the name of every torch.distributed collective called inside the block."""
    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def recording(name: str, real: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return real(*args, **kwargs)
        return call

    for name, real in originals.items():
        setattr(dist, name, recording(name, real))
    try:
        yield calls
    finally:
        for name, real in originals.items():
            setattr(dist, name, real)


# -- global_batch_stats(x) -> (mean, var) over every rank's rows -----------------------------

def rank_rows(rank: int, sizes: tuple[int, ...]) -> torch.Tensor:
    """Rank `rank`'s rows: each rank's rows centred elsewhere, with its own spread."""
    gen = torch.Generator().manual_seed(SEED + rank)
    shift = torch.tensor([1.0, -2.0, 4.0]) * (rank + 1)
    return torch.randn(sizes[rank], CHANNELS, generator=gen) * (1 + rank) + shift


def all_rows(sizes: tuple[int, ...]) -> torch.Tensor:
    return torch.cat([rank_rows(r, sizes) for r in range(len(sizes))]).double()


def _stats_on_rank(fn: Callable, sizes: tuple[int, ...]) -> dict[str, Any]:
    calls: list[str] = []
    with recorded_collectives(calls):
        out = fn(rank_rows(dist.get_rank(), sizes))
    if isinstance(out, (tuple, list)) and len(out) == 2:
        out = tuple(v.detach().cpu() if isinstance(v, torch.Tensor) else v for v in out)
    return {"out": out, "calls": calls}


def check_global_batch_stats(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn(x), given this rank's rows x of shape (N, C), must return on every rank the
    per-channel (mean, biased variance) of all ranks' rows together."""
    def judge() -> str:
        passed: list[int] = []
        runs = at_world_sizes(_stats_on_rank, fn, tuple(STATS_SIZES),
                              args=lambda n: (STATS_SIZES[n],), timeout=timeout)
        for n in STATS_SIZES:
            try:
                _, results = next(runs)
            except Rejected as failed:  # a crash or a hang at this size
                raise Rejected(_where(n, passed) + str(failed), failed.failure) from None
            hint = _stats_hint(results, STATS_SIZES[n])
            if hint:
                raise Rejected(_where(n, passed) + hint)
            passed.append(n)
        runs = "; ".join(f"{n} ranks holding {listing(STATS_SIZES[n])} rows"
                         for n in STATS_SIZES)
        return f"{runs}: every rank returned the mean and variance of all rows together."
    return run_check("check_global_batch_stats", fn, judge)


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


# -- evaluate(model, x, y) -> accuracy, called on rank 0 only --------------------------------

def net_with_batchnorm() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def eval_set() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED + 100)
    return torch.randn(64, 4, generator=gen) * 2 + 1, torch.randint(0, 3, (64,), generator=gen)


def _accuracy(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return (module(x).argmax(1) == y).float().mean().item()


def _train_a_little(model: nn.Module) -> None:
    """Three DDP training steps: the next forward through the wrapper broadcasts buffers."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(SEED + dist.get_rank())
    for _ in range(3):
        x, y = torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()


def _batchnorm_forwards(model: nn.Module) -> list[bool]:
    """A list that gets one entry per forward of the model's BatchNorm layer (or of any copy
    of it made later): whether it ran in training mode."""
    modes: list[bool] = []
    model.module[1].register_forward_hook(lambda m, i, o: modes.append(m.training))
    return modes


def _evaluate_on_rank(fn: Callable) -> dict[str, Any] | None:
    model = DDP(net_with_batchnorm())
    _train_a_little(model)
    report = None
    if dist.get_rank() == 0:
        x, y = eval_set()
        net = model.module
        before = state_snapshot(net)
        want = _accuracy(copy.deepcopy(net).eval(), x, y)
        in_training_mode = _accuracy(copy.deepcopy(net).train(), x, y)
        modes = _batchnorm_forwards(model)
        got = fn(model, x, y)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        after = state_snapshot(net)
        report = {"got": got, "want": want, "train_mode_accuracy": in_training_mode,
                  "rows": len(y), "modes": modes,
                  "training": model.training and net.training,
                  "changed": [k for k in before if not torch.equal(before[k], after[k])]}
    dist.barrier()  # the other ranks wait for rank 0's evaluation
    return report


EVAL_ERRORS = (
    ("_sync_buffers",
     "rank 0 never came back from your evaluate(): its forward through the DDP wrapper "
     "started a broadcast of the BatchNorm buffers (DDP's _sync_buffers), a collective the "
     "other ranks, waiting at the barrier, never joined. Evaluate through model.module."),
)


def check_evaluate(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """After DDP training, rank 0 alone calls fn(ddp_model, x, y) while the other ranks wait
    at a barrier: it must return the eval-mode accuracy, without hanging, and leave the
    model in training mode with its state unchanged."""
    def judge() -> str:
        for n, results in at_world_sizes(_evaluate_on_rank, fn, EVAL_WORLD_SIZES,
                                         timeout=timeout, pg_timeout=EVAL_PG_TIMEOUT,
                                         known=EVAL_ERRORS):
            try:
                want = _judge_evaluate(results[0])
            except Rejected as wrong:
                raise Rejected(f"on {n} ranks (rank 0 evaluating, the others waiting): "
                               f"{wrong}") from None
        return (f"on {listing(EVAL_WORLD_SIZES)} ranks, rank 0 evaluated on its own "
                f"(accuracy {want:.3f}, as in eval mode) while the others waited, and the "
                "model went back to training unchanged.")
    return run_check("check_evaluate", fn, judge)


def _judge_evaluate(report: dict[str, Any]) -> float:
    got, want, modes = report["got"], report["want"], report["modes"]
    if not isinstance(got, numbers.Real) or isinstance(got, bool):
        raise Rejected(f"evaluate() returned {got!r}; return the accuracy, a number between 0 "
                       "and 1 (e.g. tensor.item()).")
    if report["changed"]:
        raise Rejected(_changed_hint(report["changed"], modes))
    if abs(got - want) > 1e-6:
        raise Rejected(_accuracy_hint(got, want, report))
    if not report["training"]:
        raise Rejected("after evaluate() the model is still in eval mode: the next training "
                       "steps would use the running statistics and skip dropout. Call "
                       ".train() before returning.")
    return want


def _changed_hint(changed: list[str], modes: list[bool]) -> str:
    names = listing(changed[:3]) + (" ..." if len(changed) > 3 else "")
    if any(modes):
        return (f"evaluate() changed the model's {names}: BatchNorm ran in training mode "
                f"({sum(modes)} of its {len(modes)} forwards), so it normalised with the "
                "evaluation batch's own statistics and updated its running ones. Call .eval() "
                "first.")
    return (f"evaluate() changed the model's {names}: leave the model as you found it "
            "(evaluation must not train or modify it).")


def _accuracy_hint(got: float, want: float, report: dict[str, Any]) -> str:
    rows = report["rows"]
    if abs(got - want * rows) < 1e-6:
        return (f"evaluate() returned {got:g}, the number of correct rows: divide by the "
                f"number of rows ({rows}) to get the accuracy, {want:.4f}.")
    if abs(got - 100 * want) < 1e-4:
        return (f"evaluate() returned {got:g}, a percentage: return the share, {want:.4f}.")
    modes = report["modes"]
    if abs(got - report["train_mode_accuracy"]) < 1e-6:
        seen = (f" (the given model's BatchNorm ran {sum(modes)} forward(s) in training mode)"
                if any(modes) else "")
        return (f"evaluate() returned {got:.4f}, the accuracy with BatchNorm in training "
                f"mode{seen}: it normalised with the evaluation batch's own statistics. In "
                f"eval mode the accuracy is {want:.4f}. Call .eval() on the network you "
                "evaluate.")
    if not modes:
        return (f"evaluate() returned {got:.4f} without running the model it was given (its "
                f"BatchNorm layer never ran), and the trained model's eval-mode accuracy is "
                f"{want:.4f}: evaluate model.module, the trained network inside the wrapper.")
    return (f"evaluate() returned {got:.4f}, but the eval-mode accuracy is {want:.4f}: "
            "compute the share of rows whose largest output (argmax) is the label, with the "
            "model in eval mode.")
