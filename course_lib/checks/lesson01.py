"""Checks for lesson 01's exercises: DDP by hand. Average gradients over ranks, and start
every rank from rank 0's weights, judged against what one process computes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, on_ranks, run_check
from course_lib.checks.result import CheckResult

GRAD_WORLD_SIZES = (2, 3)
BROADCAST_WORLD_SIZE = 3
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
    return [k for k, w in want.items()
            if got.get(k) is None or not torch.allclose(got[k], w, rtol=1e-4, atol=1e-6)]


# -- average_gradients(model) ---------------------------------------------------------------

def _gradients_on_rank(fn: Callable, seed: int) -> tuple[Tensors, dict]:
    model, x, y = problem(seed)
    rank, n = dist.get_rank(), dist.get_world_size()
    nn.functional.mse_loss(model(x[rank::n]), y[rank::n]).backward()
    local = grads(model)
    fn(model)
    return local, grads(model)


def single_process_grads(seed: int = SEED) -> Tensors:
    """The gradients of the loss over the whole batch, in one process: DDP's target."""
    model, x, y = problem(seed)
    nn.functional.mse_loss(model(x), y).backward()
    return grads(model)


def check_average_gradients(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """After backward on each rank's shard, fn(model) must leave in every p.grad the
    gradient that one process computes on the whole batch (on 2 and on 3 ranks)."""
    def judge() -> str:
        want = single_process_grads()
        for n in GRAD_WORLD_SIZES:
            _judge_gradients(on_ranks(_gradients_on_rank, fn, n, (SEED,), timeout), want)
        sizes = " and ".join(map(str, GRAD_WORLD_SIZES))
        return (f"on {sizes} ranks every rank's gradients equal the single-process "
                f"gradients of the whole batch, for all {len(want)} parameters.")
    return run_check("check_average_gradients", fn, judge)


def _judge_gradients(results: list[tuple[Tensors, dict]], want: Tensors) -> None:
    n = len(results)
    for rank, (local, after) in enumerate(results):
        wrong = mismatched(after, want)
        if not wrong:
            continue
        if none := [k for k in wrong if after.get(k) is None]:
            raise Rejected(f"after your function, rank {rank}'s {none[0]}.grad is None: "
                           "leave the averaged gradient in p.grad.")
        if not mismatched({k: after[k] for k in wrong}, {k: local[k] for k in wrong}):
            raise Rejected(_unchanged_hint(rank, wrong, len(want)))
        raise Rejected(_scale_hint(rank, n, wrong, after, want))


def _unchanged_hint(rank: int, wrong: list[str], total: int) -> str:
    if len(wrong) < total:
        return (f"on rank {rank}, {', '.join(wrong)} still hold the rank's own local gradient "
                "while the other parameters were averaged: average every parameter in "
                "model.parameters().")
    return (f"rank {rank}'s gradients are unchanged: it still has only its own shard's "
            "gradient. all_reduce each p.grad in place (a copy that is reduced changes "
            "nothing in the model).")


def _scale_hint(rank: int, n: int, wrong: list[str], after: Tensors, want: Tensors) -> str:
    k = wrong[0]
    ratio = float((after[k] * want[k]).sum() / (want[k] * want[k]).sum())
    if torch.allclose(after[k], ratio * want[k], rtol=1e-3, atol=1e-6):
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


def _broadcast_on_rank(fn: Callable, seed: int) -> Tensors:
    torch.manual_seed(seed + dist.get_rank())  # each rank starts from its own weights
    model = TinyNet()
    fn(model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def check_broadcast_parameters(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Ranks build the model from different seeds; after fn(model) every rank must hold
    rank 0's initial weights."""
    def judge() -> str:
        n = BROADCAST_WORLD_SIZE
        results = on_ranks(_broadcast_on_rank, fn, n, (SEED,), timeout)
        _judge_broadcast(results, [initial_weights(SEED + r) for r in range(n)])
        return f"all {n} ranks hold rank 0's initial weights, for every parameter."
    return run_check("check_broadcast_parameters", fn, judge)


def _judge_broadcast(results: list[Tensors], starts: list[Tensors]) -> None:
    for rank, got in enumerate(results):
        wrong = mismatched(got, starts[0])
        if not wrong:
            continue
        if not mismatched(got, starts[rank]):
            raise Rejected(f"rank {rank} still has its own initial weights: copy rank 0's "
                           "into each parameter in place, dist.broadcast(p.data, src=0) "
                           "(broadcasting a copy changes nothing in the model).")
        if len(wrong) < len(starts[0]):
            raise Rejected(f"on rank {rank}, {', '.join(wrong)} differ from rank 0's while "
                           "the other parameters match: broadcast every parameter.")
        raise Rejected(_agreement_hint(rank, results, starts))


def _agreement_hint(rank: int, results: list[Tensors], starts: list[Tensors]) -> str:
    if any(mismatched(other, results[0]) for other in results[1:]):
        return (f"rank {rank}'s weights match neither rank 0's nor its own initial weights, "
                "and the ranks disagree: broadcast with src=0 on every rank.")
    mean = {k: sum(s[k] for s in starts) / len(starts) for k in starts[0]}
    if not mismatched(results[0], mean):
        return ("the ranks agree, but on the average of all ranks' weights (that is "
                "all_reduce and divide): copy rank 0's with dist.broadcast(p.data, src=0).")
    return ("the ranks agree, but not on rank 0's initial weights: broadcast with src=0 "
            "(rank 0 is the one DDP copies from).")
