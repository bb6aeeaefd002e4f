"""`check_gradient_differences` for lesson 04: after backward, the learner's function
returns on every rank the largest difference between any two ranks' gradients of each
parameter. The check plants known differences (between ranks other than 0, and between ranks
that are not neighbours) and compares at 2 and 4 ranks; its hints say whether this answer
compared with rank 0 only, with neighbours only, or compared a summary such as a norm."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, at_world_sizes, check, close
from course_lib.words import listing

DIFF_WORLD_SIZES = (2, 4)
SEED = 4


class TwoLayers(nn.Module):
    """The model whose gradients the learner compares (only its parameter names and shapes
    matter: the check sets every gradient itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)


def base_grads() -> dict[str, torch.Tensor]:
    """The gradients every rank holds before the desynchronising nudges."""
    gen = torch.Generator().manual_seed(SEED)
    with torch.random.fork_rng(devices=[]):  # TwoLayers() draws its initial weights
        shapes = {k: p.shape for k, p in TwoLayers().named_parameters()}
    return {k: torch.randn(shape, generator=gen) for k, shape in shapes.items()}


# Desynchronised: one element of fc1.weight and of fc2.weight moved by these amounts per rank.
# On 4 ranks the largest fc1.weight gap is between ranks 1 and 2 (rank 0 is not in it) and
# the largest fc2.weight gap between ranks 0 and 2 (not neighbours, not a pair r, r ^ 1).
FC1_NUDGE = {1: -0.25, 2: 0.75, 3: 0.25}
FC2_NUDGE = {0: -0.4, 2: 0.4}


def rank_grads(rank: int, desync: bool) -> dict[str, torch.Tensor]:
    """Each rank's gradients. Desynchronised: the nudges above, fc1.bias permuted on rank 2
    and fc2.bias negated on rank 1 (the same norm on every rank, and for the permutation the
    same sum)."""
    grads = {k: g.clone() for k, g in base_grads().items()}
    if desync:
        grads["fc1.weight"][0, 0] += FC1_NUDGE.get(rank, 0.0)
        grads["fc2.weight"][1, 1] += FC2_NUDGE.get(rank, 0.0)
        if rank == 1:
            grads["fc2.bias"] = -grads["fc2.bias"]
        if rank == 2:
            grads["fc1.bias"] = grads["fc1.bias"].flip(0)
    return grads


def _spread(values: list[torch.Tensor]) -> float:
    stacked = torch.stack(values)
    return float((stacked.amax(0) - stacked.amin(0)).max())


def true_differences(world_size: int, desync: bool) -> dict[str, float]:
    """The right answer: per parameter, the largest gap between any two ranks."""
    grads = [rank_grads(r, desync) for r in range(world_size)]
    return {k: _spread([g[k] for g in grads]) for k in grads[0]}


def from_rank0_differences(world_size: int, desync: bool) -> dict[str, float]:
    """What comparing every rank with rank 0 only gives (a plausible mistake)."""
    grads = [rank_grads(r, desync) for r in range(world_size)]
    return {k: max(float((g[k] - grads[0][k]).abs().max()) for g in grads) for k in grads[0]}


def neighbour_differences(world_size: int, desync: bool) -> dict[str, float]:
    """What comparing each rank with the next one (in a ring) only gives."""
    grads = [rank_grads(r, desync) for r in range(world_size)]
    return {k: max(float((g[k] - grads[(r + 1) % world_size][k]).abs().max())
                   for r, g in enumerate(grads)) for k in grads[0]}


def _differences_on_rank(fn: Callable, desync: bool) -> Any:
    torch.manual_seed(SEED)
    model = TwoLayers()
    for name, p in model.named_parameters():
        p.grad = rank_grads(dist.get_rank(), desync)[name]
    out = fn(model)
    if isinstance(out, dict):
        return {k: (v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v)
                for k, v in out.items()}
    return out


@check
def check_gradient_differences(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(model), called on every rank after backward, must return on every rank
    {parameter name: largest absolute difference between any two ranks' gradients}."""
    for desync in (False, True):
        passed: list[int] = []  # the world sizes this answer got right, with this data
        for n, results in at_world_sizes(_differences_on_rank, fn, DIFF_WORLD_SIZES,
                                         (desync,), timeout):
            _judge_differences(results, n, desync, passed)
            passed.append(n)
    found = true_differences(DIFF_WORLD_SIZES[-1], True)
    shown = ", ".join(f"{k} {v:.3g}" for k, v in found.items())
    return (f"on {listing(DIFF_WORLD_SIZES)} ranks: 0 everywhere when the gradients "
            f"agree, and exactly the differences made on purpose when they do not (on "
            f"{DIFF_WORLD_SIZES[-1]} ranks: {shown}).")


def _judge_differences(results: list[Any], n: int, desync: bool, passed: list[int]) -> None:
    want = true_differences(n, desync)
    _check_shape(0, results[0], want)
    for rank, got in enumerate(results[1:], start=1):
        if got != results[0]:
            raise Rejected(f"on {n} ranks, rank {rank} returned {_fmt(got)} but rank 0 "
                           f"returned {_fmt(results[0])}: every rank must get the result "
                           "(all_reduce or all_gather, not reduce or gather to one rank).")
    got = results[0]
    wrong = [k for k, v in want.items() if not close(got[k], v)]
    if not wrong:
        return
    lead = (f"your answer was right on {listing(passed)} ranks but not on {n}: " if passed
            else f"on {n} ranks, ")
    raise Rejected(lead + _differences_hint(got, want, wrong, n, desync))


def _differences_hint(got: dict[str, Any], want: dict[str, float], wrong: list[str], n: int,
                      desync: bool) -> str:
    """What this answer's wrong numbers look like: a summary, rank 0 or neighbours only."""
    if zeros := [k for k in wrong if got[k] == 0]:
        name = zeros[0]
        if any(got[k] > 0 for k in want):
            why = (" Its norm is the same on every rank (only the signs or the order of its "
                   "values differ): compare the values element by element, not a summary "
                   "of them.")
        else:
            why = (" Compare across ranks with a collective: all_gather the gradients, or "
                   "all_reduce copies with op MAX and with op MIN.")
        return (f"you reported 0 for {name}, but the ranks' gradients differ by up to "
                f"{want[name]:.4g}.{why}")
    name = wrong[0]
    if all(close(got[k], v) for k, v in from_rank0_differences(n, desync).items() if k in wrong):
        return (f"{name}: you reported {got[name]:.4g}, the largest difference from rank 0's "
                f"gradient; the largest between any two ranks is {want[name]:.4g} (between "
                "two ranks other than 0). Take the largest minus the smallest value over all "
                "ranks.")
    if all(close(got[k], v) for k, v in neighbour_differences(n, desync).items() if k in wrong):
        return (f"{name}: you reported {got[name]:.4g}, the largest difference between "
                f"neighbouring ranks; ranks further apart differ by {want[name]:.4g}. Compare "
                "all ranks at once: the largest minus the smallest value over all ranks.")
    return (f"{name}: you reported {got[name]:.4g}, expected {want[name]:.4g} (the largest, "
            "over its elements, of the largest minus the smallest value over ranks).")


def _check_shape(rank: int, got: Any, want: dict[str, float]) -> None:
    if not isinstance(got, dict):
        raise Rejected(f"rank {rank} returned {got!r}; return a dict "
                       "{parameter name: largest difference}.")
    if missing := [k for k in want if k not in got]:
        raise Rejected(f"rank {rank}'s answer has no entry for {', '.join(missing)}: include "
                       "every parameter of model.named_parameters().")
    for name in want:
        if not isinstance(got[name], numbers.Real):
            raise Rejected(f"rank {rank} returned {got[name]!r} for {name}; return a number "
                           "(a float, e.g. tensor.item()).")


def _fmt(values: Any) -> str:
    if isinstance(values, dict):
        return "{" + ", ".join(f"{k}: {v:.3g}" if isinstance(v, numbers.Real) else f"{k}: {v!r}"
                               for k, v in values.items()) + "}"
    return repr(values)
