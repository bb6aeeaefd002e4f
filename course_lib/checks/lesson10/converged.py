"""Check for lesson 10's first exercise: fix a training loop that hangs because each rank decides
on its own loss when to stop."""

from __future__ import annotations

import numbers
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
    state_snapshot,
)
from course_lib.checks.lesson10.parting import time_limit_note, where_parted
from course_lib.words import listing

WORLD_SIZES = (2, 3)
SEED = 10
STEPS, BATCH, LR = 30, 32, 0.1
TARGET = 0.3  # the mean loss over ranks falls below it (step 12 on 2 ranks, 11 on 3)
NOISE = 0.7  # the last rank's labels are noisy: its own loss stays near NOISE**2 = 0.49
HANG_AFTER_S = 4.0  # a hang ends in seconds, not in gloo's default 30 minutes
TRUE_W = (1.0, -2.0, 0.5, 3.0)


def rank_batches(rank: int, world_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's STEPS batches: y = x @ TRUE_W, with noise on the last rank only."""
    gen = torch.Generator().manual_seed(SEED * 100 + rank)
    noise = NOISE if rank == world_size - 1 else 0.0
    w = torch.tensor(TRUE_W).unsqueeze(1)
    batches = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, 4, generator=gen)
        batches.append((x, x @ w + noise * torch.randn(BATCH, 1, generator=gen)))
    return batches


def _train_on_rank(fn: Callable) -> tuple[Any, dict[str, torch.Tensor]]:
    """fn(ddp_model, this rank's batches, TARGET) on this rank; its return and the weights."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    model = DDP(nn.Linear(4, 1))
    steps = fn(model, rank_batches(rank, world_size), TARGET)
    return steps, state_snapshot(model.module)


# -- what one process computes ---------------------------------------------------------------

def _mean(losses: torch.Tensor) -> bool:
    return losses.mean().item() < TARGET


RULES: dict[str, Callable[[torch.Tensor], bool]] = {
    "mean": _mean,
    "sum": lambda losses: losses.sum().item() < TARGET,
    "rank 0": lambda losses: losses[0].item() < TARGET,
    "max": lambda losses: losses.max().item() < TARGET,
}


def simulate(world_size: int, stop: Callable[[torch.Tensor], bool] = _mean,
             grad_scale: float = 1.0, limit: int = STEPS,
             ) -> tuple[int, dict[str, torch.Tensor]]:
    """The steps and weights of DDP training stopped by `stop` (given every rank's loss),
    computed in one process: DDP's gradient is the mean of the ranks' gradients, the
    gradient of the ranks' mean loss (equal batch sizes). `grad_scale` multiplies the loss
    each rank back-propagates; `limit` caps the batches. The kernel's random state is kept."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    data = [rank_batches(r, world_size) for r in range(world_size)]
    steps = 0
    for i in range(limit):
        losses = torch.stack([F.mse_loss(model(d[i][0]), d[i][1]) for d in data])
        if stop(losses.detach()):
            break
        (losses.mean() * grad_scale).backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
    return steps, state_snapshot(model)


# -- the check -------------------------------------------------------------------------------

@check
def check_train_until_converged(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(model, batches, target) must train the DDP model on this rank's batches and stop,
    on every rank at the same step, before the first step whose loss averaged over all ranks
    is below target; it returns the number of optimizer steps taken."""
    for n, results in at_world_sizes(_train_on_rank, fn, WORLD_SIZES, timeout=timeout,
                                     hang_after=HANG_AFTER_S, diagnose=_hang_hint):
        _judge(n, results)
    return (f"on {listing(WORLD_SIZES)} ranks every rank stopped at the step where the "
            "loss averaged over all ranks first fell below the target, with one "
            "process's weights: no hang, and the same decision everywhere.")


def _hang_hint(failure: Failure) -> str | None:
    """Where the ranks parted, from the desync report of the failed launch."""
    parted = where_parted(getattr(failure.error, "desync", None))
    if parted is None:
        return None
    return (f"on {failure.world_size} ranks {parted} Some ranks left the loop while others "
            "trained on: each rank decided on its own loss. Decide together: all-reduce the "
            "loss (divided by the world size) before the `if`, so every rank takes the same "
            "branch." + time_limit_note(failure))


def _judge(n: int, results: list) -> None:
    steps = [s for s, _ in results]
    if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in steps):
        raise Rejected(f"on {n} ranks your function returned {steps!r}: return the number of "
                       "optimizer steps taken, an int.")
    if len(set(steps)) > 1:
        raise Rejected(f"on {n} ranks the ranks report different step counts {steps}: every "
                       "rank must stop at the same step.")
    want_steps, want = simulate(n)
    got = steps[0]
    if got != want_steps:
        raise Rejected(_steps_hint(n, got, want_steps, results[0][1]))
    bad = differing(results[0][1], want)
    if bad:
        raise Rejected(f"on {n} ranks you stopped after the right {got} steps, but the weights "
                       f"({listing(bad)}) differ from one process's: back-propagate this "
                       "rank's own loss and let DDP average the gradients; use the averaged "
                       "loss only to decide.")


def _steps_hint(n: int, got: int, want: int, weights: dict[str, torch.Tensor]) -> str:
    """Why the ranks stopped after `got` steps: a stopping rule or a training that gives both
    that count and these weights is named; otherwise only what differs."""
    def gives(steps_and_weights: tuple[int, dict[str, torch.Tensor]]) -> bool:
        return steps_and_weights[0] == got and not differing(weights, steps_and_weights[1])

    base = (f"on {n} ranks every rank stopped after {got} steps; the loss averaged over all "
            f"ranks first falls below the target at step {want}, so {want} steps.")
    if gives(simulate(n, RULES["sum"])) or gives(simulate(n, RULES["max"])):
        return (f"{base} {got} steps, with these weights, is where the sum, or the largest, of "
                "the ranks' losses falls below it: decide on the mean: all_reduce with "
                "ReduceOp.SUM (the default), then divide by dist.get_world_size(). A sum left "
                "undivided, or ReduceOp.MAX, is not the mean.")
    if gives(simulate(n, RULES["rank 0"])):
        return (f"{base} {got} is where rank 0's own loss falls below it: decide on the mean "
                "over all ranks, not on one rank's loss.")
    for scale, what in ((1 / n, f"1/{n} of DDP's: you back-propagated the loss divided by "
                         "the world size (an all-reduce on the way adds no gradient)"),
                        (n, f"{n} times DDP's: you back-propagated the loss times the world "
                            "size")):
        if gives(simulate(n, grad_scale=scale)):
            return (f"{base} You decided on the mean, but your weights are those of gradients "
                    f"{what}. DDP already averages the gradients: back-propagate each rank's "
                    "own loss, unscaled, and all-reduce a detached copy "
                    "(loss.detach().clone()) to decide.")
    if gives(simulate(n, lambda _losses: False, limit=got)):
        off = f"{abs(got - want)} {'more' if got > want else 'fewer'}"
        return (f"{base} {'One step off: y' if abs(got - want) == 1 else 'Y'}ou trained {got} "
                f"steps on the right gradients, {off} than the mean allows: check the "
                "averaged loss of a batch before its loss.backward() and optimizer.step().")
    if not differing(weights, simulate(n)[1]):
        return (f"{base} Your weights are right after {want} steps: count only the optimizer "
                "steps you took.")
    return (f"{base} Your step count and your weights differ from every simple stopping rule: "
            "the training itself went another way. Back-propagate each rank's own loss, "
            "unscaled (DDP averages the gradients), step once per batch, and use an averaged "
            "copy only to decide.")
