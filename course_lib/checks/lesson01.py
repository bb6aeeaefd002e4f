"""Checks for lesson 01's exercises: DDP by hand. Average gradients over ranks, and start
every rank from rank 0's weights, judged against what one process computes, at two world
sizes, with hints worded from the collectives the answer called."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course_lib.checks import collectives
from course_lib.checks.common import (
    ATOL,
    CHECK_TIMEOUT,
    RTOL,
    Rejected,
    at_world_sizes,
    check,
    differing,
)
from course_lib.words import listing

GRAD_WORLD_SIZES = (2, 4)  # 4 catches "divide by 2"; the shards below also differ in content
BROADCAST_WORLD_SIZES = (2, 3)
SAMPLES = 12  # divisible by every world size, so each rank's shard has the same size
SEED = 7

Tensors = dict[str, torch.Tensor]


class TinyNet(nn.Module):
    """A two-layer network, small enough to compare every gradient exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def problem(seed: int = SEED) -> tuple[TinyNet, torch.Tensor, torch.Tensor]:
    """The same model and data on every rank and in the kernel (whose own random state
    is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyNet(), torch.randn(SAMPLES, 4), torch.randn(SAMPLES, 2)


def grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {k: None if p.grad is None else p.grad.detach().clone()
            for k, p in model.named_parameters()}


def mismatched(got: dict[str, Any], want: Tensors) -> list[str]:
    """Names of the tensors in `got` that differ from `want` (a missing one differs)."""
    return differing(got, want)


# -- average_gradients(model) ---------------------------------------------------------------

def _gradients_on_rank(fn: Callable, seed: int) -> tuple[Tensors, dict, dict[str, int]]:
    model, x, y = problem(seed)
    rank, n = dist.get_rank(), dist.get_world_size()
    nn.functional.mse_loss(model(x[rank::n]), y[rank::n]).backward()
    local = grads(model)
    in_place = [p.grad for p in model.parameters()]
    with collectives.recorded() as calls:
        fn(model)
    done = {"all_reduce": collectives.count(calls, "all_reduce"),
            "on_grads": collectives.touched(calls, "all_reduce", in_place)}
    return local, grads(model), done


def single_process_grads(seed: int = SEED) -> Tensors:
    """The gradients of the loss over the whole batch, in one process: DDP's target."""
    model, x, y = problem(seed)
    nn.functional.mse_loss(model(x), y).backward()
    return grads(model)


@check
def check_average_gradients(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """After backward on each rank's shard, fn(model) must leave in every p.grad the
    gradient that one process computes on the whole batch (on 2 and on 3 ranks)."""
    want = single_process_grads()
    for _, results in at_world_sizes(_gradients_on_rank, fn, GRAD_WORLD_SIZES, (SEED,),
                                     timeout):
        _judge_gradients(results, want)
    return (f"on {listing(GRAD_WORLD_SIZES)} ranks every rank's gradients equal the "
            f"single-process gradients of the whole batch, for all {len(want)} parameters.")


def _judge_gradients(results: list[tuple[Tensors, dict, dict[str, int]]],
                     want: Tensors) -> None:
    n = len(results)
    for rank, (local, after, done) in enumerate(results):
        wrong = mismatched(after, want)
        if not wrong:
            continue
        if none := [k for k in wrong if after.get(k) is None]:
            raise Rejected(f"with {n} ranks, after your function rank {rank}'s {none[0]}.grad "
                           "is None: leave the averaged gradient in p.grad.")
        if not mismatched({k: after[k] for k in wrong}, {k: local[k] for k in wrong}):
            raise Rejected(_unchanged_hint(rank, n, wrong, len(want), done))
        if not done["all_reduce"]:
            raise Rejected(f"with {n} ranks, rank {rank}'s {wrong[0]}.grad changed but is not "
                           "the average over ranks, and no all_reduce was called: a rank "
                           "alone cannot know the others' gradients. all_reduce each p.grad "
                           "(SUM), then divide by the world size.")
        raise Rejected(_scale_hint(rank, n, wrong, after, want))


def _unchanged_hint(rank: int, n: int, wrong: list[str], total: int,
                    done: dict[str, int]) -> str:
    if len(wrong) < total:
        return (f"with {n} ranks, on rank {rank} {', '.join(wrong)} still hold the rank's own "
                "local gradient while the other parameters were averaged: average every "
                "parameter in model.parameters().")
    start = (f"with {n} ranks, rank {rank}'s gradients are unchanged: it still has only its "
             "own shard's gradient.")
    if done["all_reduce"] and not done["on_grads"]:
        return (f"{start} It called all_reduce {done['all_reduce']} time(s), but on copies of "
                "the gradients, which were then thrown away: all_reduce p.grad itself, in "
                "place (or copy the result back into p.grad).")
    if not done["all_reduce"]:
        return f"{start} It called no all_reduce: all_reduce each p.grad, then divide."
    return f"{start} all_reduce each p.grad in place, then divide by the world size."


def _scale_hint(rank: int, n: int, wrong: list[str], after: Tensors, want: Tensors) -> str:
    k = wrong[0]
    ratio = float((after[k] * want[k]).sum() / (want[k] * want[k]).sum())
    if torch.allclose(after[k], ratio * want[k], rtol=10 * RTOL, atol=ATOL):
        fix = ("divide the sum by dist.get_world_size()" if abs(ratio - n) < 1e-3 else
               f"divide the sum by the world size ({n} here), not by a fixed number")
        return (f"with {n} ranks, rank {rank}'s {k}.grad is {ratio:.3g}x the single-process "
                f"gradient: all_reduce adds the ranks' gradients; {fix}.")
    return (f"with {n} ranks, rank {rank}'s {k}.grad differs from the single-process gradient "
            "(and is not a multiple of it): all_reduce (SUM) each p.grad, then divide by "
            "the world size.")


# -- broadcast_parameters(model) -----------------------------------------------------------

def initial_weights(seed: int) -> Tensors:
    """The weights a TinyNet starts from after torch.manual_seed(seed)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return {k: v.detach().clone() for k, v in TinyNet().state_dict().items()}


def _broadcast_on_rank(fn: Callable, seed: int) -> tuple[Tensors, dict[str, int]]:
    torch.manual_seed(seed + dist.get_rank())  # each rank starts from its own weights
    model = TinyNet()
    with collectives.recorded() as calls:
        fn(model)
    done = {"broadcast": collectives.count(calls, "broadcast"),
            "on_params": collectives.touched(calls, "broadcast", list(model.parameters()))}
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, done


@check
def check_broadcast_parameters(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """Ranks build the model from different seeds; after fn(model) every rank must hold
    rank 0's initial weights (on 2 and on 3 ranks)."""
    for n, results in at_world_sizes(_broadcast_on_rank, fn, BROADCAST_WORLD_SIZES,
                                     (SEED,), timeout):
        _judge_broadcast(results, [initial_weights(SEED + r) for r in range(n)])
    return (f"on {listing(BROADCAST_WORLD_SIZES)} ranks every rank holds rank 0's initial "
            "weights, for every parameter.")


def _judge_broadcast(results: list[tuple[Tensors, dict[str, int]]],
                     starts: list[Tensors]) -> None:
    n = len(results)
    weights = [got for got, _ in results]
    for rank, (got, done) in enumerate(results):
        wrong = mismatched(got, starts[0])
        if not wrong:
            continue
        if not mismatched(got, starts[rank]):
            raise Rejected(_still_own_hint(rank, n, done))
        if len(wrong) < len(starts[0]):
            raise Rejected(f"with {n} ranks, on rank {rank} {', '.join(wrong)} differ from rank "
                           "0's while the other parameters match: broadcast every parameter.")
        raise Rejected(_agreement_hint(rank, weights, starts))


def _still_own_hint(rank: int, n: int, done: dict[str, int]) -> str:
    start = f"with {n} ranks, rank {rank} still has its own initial weights."
    if done["broadcast"] and not done["on_params"]:
        return (f"{start} It called broadcast {done['broadcast']} time(s), but on copies of the "
                "parameters, which were then thrown away: broadcast into the parameter itself, "
                "dist.broadcast(p.data, src=0) (or copy the received tensor back into p).")
    if not done["broadcast"]:
        return (f"{start} It called no broadcast: dist.broadcast(p.data, src=0) for every "
                "parameter, on every rank.")
    return f"{start} Copy rank 0's into each parameter in place: dist.broadcast(p.data, src=0)."


def _agreement_hint(rank: int, results: list[Tensors], starts: list[Tensors]) -> str:
    if any(mismatched(other, results[0]) for other in results[1:]):
        return (f"with {len(results)} ranks, rank {rank}'s weights match neither rank 0's "
                "nor its own initial weights, "
                "and the ranks disagree: broadcast with src=0 on every rank.")
    mean = {k: sum(s[k] for s in starts) / len(starts) for k in starts[0]}
    if not mismatched(results[0], mean):
        return (f"with {len(results)} ranks, the ranks agree, but on the average of all "
                "ranks' weights (that is "
                "all_reduce and divide): copy rank 0's with dist.broadcast(p.data, src=0).")
    source = next((r for r, start in enumerate(starts) if not mismatched(results[0], start)),
                  None)
    if source is not None:
        return (f"with {len(results)} ranks, the ranks agree, but on rank {source}'s initial "
                "weights: broadcast with src=0 (rank 0 is the one DDP copies from).")
    return (f"with {len(results)} ranks, the ranks agree, but not on rank 0's initial "
            "weights: broadcast with src=0 (rank 0 is the one DDP copies from).")
