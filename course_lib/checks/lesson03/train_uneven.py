"""Check for lesson 03's third exercise: train_uneven(ddp_model, batches, optimizer) trains
every batch once although the ranks hold different numbers of batches, and ends with the
weights one process would get; a loop that hangs is told how far each rank got."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from course_lib.checks.common import (
    CHECK_TIMEOUT,
    Failure,
    Rejected,
    at_world_sizes,
    check,
    same,
    state_snapshot,
)
from course_lib.checks.lesson03.counted_reads import SEED
from course_lib.telemetry import Recorder
from course_lib.words import listing

UNEVEN_BATCHES = ((3, 5), (4, 2, 5))  # batches per rank, at 2 and at 3 ranks
# A rank left waiting in a collective fails after this (common.on_ranks: or half the check's
# limit, if less), while its records still come back: the hint then says how far each rank got.
HANG_AFTER_S = 10.0
LR = 0.1
Batch = tuple[torch.Tensor, torch.Tensor]


class CountedBatches:
    """The rank's batches; records how many the training loop took, even if it then hangs."""

    def __init__(self, batches: list[Batch], rec: Recorder) -> None:
        self.batches, self.taken, self.rec = batches, 0, rec

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.batches:
            self.taken += 1
            self.rec.scalar("taken", self.taken, step=self.taken)
            yield batch

    def __len__(self) -> int:
        return len(self.batches)


def _train_on_rank(fn: Callable, counts: tuple[int, ...]) -> dict:
    rank = dist.get_rank()
    torch.manual_seed(SEED)
    model = nn.Linear(4, 1)
    start = state_snapshot(model)
    ddp_model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=LR)
    torch.manual_seed(SEED + rank)
    batches = CountedBatches([(torch.randn(8, 4), torch.randn(8, 1))
                              for _ in range(counts[rank])], Recorder())
    fn(ddp_model, batches, optimizer)
    return {"taken": batches.taken, "state": state_snapshot(model), "start": start,
            "batches": batches.batches}


@check
def check_train_uneven(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(ddp_model, batches, optimizer) on 2 ranks (3 and 5 batches) and 3 ranks (4, 2 and 5)
    must train on every batch of every rank, finish on every rank, and end with the weights
    that averaged steps over all the ranks' batches give."""
    by_size: dict[int, tuple[int, ...]] = {len(c): c for c in UNEVEN_BATCHES}

    for _, results in at_world_sizes(_train_on_rank, fn, tuple(by_size),
                                     lambda n: (by_size[n],), timeout, hang_after=HANG_AFTER_S,
                                     diagnose=lambda failure: _hang_hint(failure, by_size)):
        _judge_training(results)
    cases = " and ".join(f"{listing(c)} batches" for c in UNEVEN_BATCHES)
    return (f"ranks with {cases} trained on all of them, finished together, and ended "
            "with the weights of averaged steps over every rank's batches.")


def _hang_hint(failure: Failure, by_size: dict[int, tuple[int, ...]]) -> str | None:
    """A hang (a rank left waiting in a collective) told with what each rank took; None for
    any other failure."""
    if not (failure.timed_out or failure.consequence or "Timed out" in failure.message):
        return None
    counts = by_size[failure.world_size]
    taken = _taken_before_failure(failure)
    if taken is None:
        story = (f"with {listing(counts)} batches on the {len(counts)} ranks, a rank that ran "
                 "out of batches moved on while another waited in its next backward's "
                 "all-reduce.")
    else:
        done = [r for r, (t, n) in enumerate(zip(taken, counts)) if t >= n]
        busy = [r for r, (t, n) in enumerate(zip(taken, counts)) if t < n]
        story = ("; ".join(f"rank {r} took {t} of its {n} batches"
                           for r, (t, n) in enumerate(zip(taken, counts)))
                 + (f": rank {listing(done)} ran out and moved on while rank {listing(busy)} "
                    "waited in an all-reduce of DDP's backward that the others never joined."
                    if done and busy else "."))
    return failure.explained(f"the ranks did not all finish: {story} Wrap the loop in "
                             "Join([ddp_model]).")


def _taken_before_failure(failure: Failure) -> list[int] | None:
    """How many batches each rank took before the launch failed, from its records."""
    run = getattr(failure.error, "run", None)
    if run is None:
        return None
    table = run.telemetry.scalars
    if sorted(run.telemetry.ranks) != list(range(failure.world_size)):
        return None
    return [int(table.where(rank=r, name="taken")["value"].max(initial=0))
            for r in range(failure.world_size)]


def _judge_training(results: list[dict]) -> None:
    world = len(results)
    counts = [len(got["batches"]) for got in results]
    for rank, got in enumerate(results):
        if got["taken"] < counts[rank]:
            raise Rejected(f"with {world} ranks, rank {rank} trained on {got['taken']} of its "
                           f"{counts[rank]} batches: every rank must use all of its own data. "
                           "Join([ddp_model]) lets the ranks with fewer batches finish first.")
    start, states = results[0]["start"], [got["state"] for got in results]
    if all(all(same(s[k], v) for k, v in start.items()) for s in states):
        raise Rejected("the weights did not change: call loss.backward() and "
                       "optimizer.step() for each batch.")
    for rank, state in enumerate(states[1:], start=1):
        if not all(same(state[k], v) for k, v in states[0].items()):
            raise Rejected(f"with {world} ranks, after training rank {rank}'s weights differ "
                           "from rank 0's: some steps were not averaged over the ranks (a "
                           "no_sync(), or training outside DDP?). Let DDP all-reduce every "
                           "step, inside Join.")
    _compare_with_true(states[0], start, [got["batches"] for got in results])


def _compare_with_true(got: dict[str, torch.Tensor], start: dict[str, torch.Tensor],
                       batches: list[list[Batch]]) -> None:
    """The ranks agree; their weights must be those of averaged steps over all batches."""
    world, fewest = len(batches), min(len(b) for b in batches)
    matches = lambda want: all(same(got[k], w) for k, w in want.items())  # noqa: E731
    if matches(_trained(start, batches)) or matches(_trained(start, batches, by_active=True)):
        return
    if matches(_trained(start, batches, steps=fewest)):
        raise Rejected(f"with {world} ranks, every rank read all of its batches, but the "
                       f"weights are those of training on the first {fewest} batches of each "
                       "rank only: the longer ranks' extra batches were never trained on. "
                       "Train on every batch inside Join([ddp_model]).")
    for rank, own in enumerate(batches):
        if matches(_trained(start, [own])):
            raise Rejected(f"with {world} ranks, every rank ended with the weights that rank "
                           f"{rank} gets by training alone on its own batches: the ranks' "
                           "gradients were never averaged (training on ddp_model.module, or "
                           f"under no_sync(), then copying rank {rank}'s weights?). Train the "
                           "DDP model itself, inside Join([ddp_model]).")
    gap = max((got[k] - w).abs().max().item() for k, w in _trained(start, batches).items())
    raise Rejected(f"with {world} ranks the ranks agree, but their weights are {gap:.2g} away "
                   "from those of averaged DDP steps over every rank's batches (SGD, lr "
                   f"{LR}): train each batch once, with ddp_model, inside Join([ddp_model]).")


def _trained(start: dict[str, torch.Tensor], batches: Sequence[list[Batch]],
             by_active: bool = False, steps: int | None = None) -> dict[str, torch.Tensor]:
    """The weights DDP with Join gives: at step k, the mean-squared-error gradients of the
    ranks that still have a batch k, summed and divided by the world size (or by the number
    of those ranks: Join's divide_by_initial_world_size=False), then one SGD step."""
    weight, bias = (start["weight"].double().clone(), start["bias"].double().clone())
    for k in range(steps or max(len(b) for b in batches)):
        active = [b[k] for b in batches if k < len(b)]
        grads = [_gradient(weight, bias, x, y) for x, y in active]
        divide = len(active) if by_active else len(batches)
        weight = weight - LR * sum(g for g, _ in grads) / divide
        bias = bias - LR * sum(g for _, g in grads) / divide
    return {"weight": weight, "bias": bias}


def _gradient(weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor,
              y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """d mse_loss(x @ weight.T + bias, y) / d (weight, bias), in closed form."""
    error = x.double() @ weight.T + bias - y.double()  # (batch, 1)
    scale = 2.0 / error.numel()
    return scale * error.T @ x.double(), scale * error.sum(dim=0)
