"""Checks for lesson 04's exercises: wrap a multi-task model so that DDP can train it, and
measure how far the ranks' gradients are apart."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, on_ranks, run_check
from course_lib.checks.result import CheckResult

WRAP_WORLD_SIZE = 2
TASKS = "aabab"  # step 0 leaves head_b unused; the set of used heads changes from step 2 on
BATCH = 8  # per step, split evenly over the ranks
SEED = 4
DIFF_WORLD_SIZE = 3

# (fragment of a rank's error, hint): the errors a wrong wrapping meets, each explained.
WRAP_ERRORS = (
    ("Expected to have finished reduction",
     "training crashed at step 1 with DDP's \"Expected to have finished reduction in the "
     "prior iteration\": in step 0 head_b got no gradient, so DDP never all-reduced its "
     "bucket. Tell DDP that some parameters may go unused: find_unused_parameters=True."),
    ("training graph has changed",
     "static_graph=True promises that the same parameters are used in every step, but this "
     "job switches between the heads (\"Your training graph has changed in this "
     "iteration\"). Use find_unused_parameters=True, which finds the unused ones every step."),
)


# -- wrap_model(model) -> a DDP model that trains a multi-task network ------------------------

class MultiTask(nn.Module):
    """A shared body and one head per task: a batch of task "a" never touches head_b."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 16)
        self.head_a = nn.Linear(16, 3)
        self.head_b = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, task: str) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        return self.head_a(h) if task == "a" else self.head_b(h)


def task_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one step (every rank and the kernel build the same one)."""
    gen = torch.Generator().manual_seed(SEED * 100 + step)
    return torch.randn(BATCH, 6, generator=gen), torch.randint(0, 3, (BATCH,), generator=gen)


def train(model: nn.Module, forward: Callable, rank: int, world_size: int) -> None:
    """SGD over TASKS on this rank's share of every step's batch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step, task in enumerate(TASKS):
        x, y = task_batch(step)
        loss = nn.functional.cross_entropy(forward(x[rank::world_size], task),
                                           y[rank::world_size])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _wrap_on_rank(fn: Callable) -> dict[str, Any]:
    torch.manual_seed(SEED)
    model = MultiTask()
    wrapped = fn(model)
    if not isinstance(wrapped, DDP):
        return {"type": type(wrapped).__name__}
    if wrapped.module is not model:
        return {"type": "DistributedDataParallel", "other_module": True}
    train(model, wrapped, dist.get_rank(), dist.get_world_size())
    return {"type": "DistributedDataParallel",
            "weights": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def reference_weights() -> dict[str, torch.Tensor]:
    """The weights one process reaches training on the whole batches (run in the kernel,
    whose own random state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = MultiTask()
    train(model, model, 0, 1)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def check_wrap_model(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn(model) must return the model wrapped in DDP so that a job switching between the
    two heads trains on every rank exactly as one process does on the whole batches."""
    def judge() -> str:
        results = on_ranks(_wrap_on_rank, fn, WRAP_WORLD_SIZE, timeout=timeout,
                               known=WRAP_ERRORS)
        _judge_wrap(results, reference_weights())
        return (f"trained {len(TASKS)} steps of tasks {', '.join(TASKS)} on "
                f"{WRAP_WORLD_SIZE} ranks; every rank's weights equal one process's.")
    return run_check("check_wrap_model", fn, judge)


def _judge_wrap(results: list[dict[str, Any]], want: dict[str, torch.Tensor]) -> None:
    for rank, got in enumerate(results):
        if got["type"] != "DistributedDataParallel":
            raise Rejected(f"on rank {rank} wrap_model() returned a {got['type']}, not a "
                           "DistributedDataParallel: without DDP the ranks never average "
                           "their gradients. Return DDP(model, ...).")
        if got.get("other_module"):
            raise Rejected("the DDP you returned wraps another module, not the model you "
                           "were given: wrap `model` itself.")
    for rank, got in enumerate(results):
        wrong = [k for k, w in want.items()
                 if not torch.allclose(got["weights"][k], w, rtol=1e-4, atol=1e-6)]
        if wrong:
            raise Rejected(f"after training, rank {rank}'s {', '.join(wrong)} differ from "
                           "what one process computes on the whole batches. Pass the model "
                           "to DDP unchanged, with find_unused_parameters=True.")


# -- gradient_differences(model) -> {name: largest difference between any two ranks} ---------

class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)


def base_grads() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED)
    with torch.random.fork_rng(devices=[]):  # TwoLayers() draws its initial weights
        shapes = {k: p.shape for k, p in TwoLayers().named_parameters()}
    return {k: torch.randn(shape, generator=gen) for k, shape in shapes.items()}


def rank_grads(rank: int, desync: bool) -> dict[str, torch.Tensor]:
    """Each rank's gradients. Desynchronised: fc1.weight nudged on ranks 1 and 2 (in
    opposite directions), fc1.bias permuted on rank 2 and fc2.bias negated on rank 1 (the
    same norm and, for the permutation, the same sum on every rank); fc2.weight equal."""
    grads = {k: g.clone() for k, g in base_grads().items()}
    if desync:
        if rank == 1:
            grads["fc1.weight"][0, 0] -= 0.25
            grads["fc2.bias"] = -grads["fc2.bias"]
        if rank == 2:
            grads["fc1.weight"][0, 0] += 0.75
            grads["fc1.bias"] = grads["fc1.bias"].flip(0)
    return grads


def true_differences(world_size: int, desync: bool) -> dict[str, float]:
    grads = [rank_grads(r, desync) for r in range(world_size)]
    return {k: float((torch.stack([g[k] for g in grads]).amax(0)
                      - torch.stack([g[k] for g in grads]).amin(0)).max())
            for k in grads[0]}


def from_rank0_differences(world_size: int, desync: bool) -> dict[str, float]:
    """What comparing every rank with rank 0 only gives (a plausible mistake)."""
    grads = [rank_grads(r, desync) for r in range(world_size)]
    return {k: max(float((g[k] - grads[0][k]).abs().max()) for g in grads) for k in grads[0]}


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


def check_gradient_differences(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn(model), called on every rank after backward, must return on every rank
    {parameter name: largest absolute difference between any two ranks' gradients}."""
    def judge() -> str:
        n = DIFF_WORLD_SIZE
        for desync in (False, True):
            results = on_ranks(_differences_on_rank, fn, n, (desync,), timeout)
            _judge_differences(results, true_differences(n, desync),
                               from_rank0_differences(n, desync))
        found = true_differences(n, True)
        shown = ", ".join(f"{k} {v:.3g}" for k, v in found.items())
        return (f"on {n} ranks: 0 everywhere when the gradients agree, and exactly the "
                f"differences made on purpose when they do not ({shown}).")
    return run_check("check_gradient_differences", fn, judge)


def _judge_differences(results: list[Any], want: dict[str, float],
                       from_rank0: dict[str, float]) -> None:
    _check_shape(0, results[0], want)
    for rank, got in enumerate(results[1:], start=1):
        if got != results[0]:
            raise Rejected(f"rank {rank} returned {_fmt(got)} but rank 0 returned "
                           f"{_fmt(results[0])}: every rank must get the result (all_reduce "
                           "or all_gather, not reduce or gather to one rank).")
    got = results[0]
    wrong = [k for k, v in want.items()
             if not math.isclose(got[k], v, rel_tol=1e-5, abs_tol=1e-7)]
    if not wrong:
        return
    if zeros := [k for k in wrong if got[k] == 0]:
        name = zeros[0]
        if any(got[k] > 0 for k in want):
            why = (" Its norm is the same on every rank (only the signs or the order of its "
                   "values differ): compare the values element by element, not a summary "
                   "of them.")
        else:
            why = (" Compare across ranks with a collective: all_gather the gradients, or "
                   "all_reduce copies with op MAX and with op MIN.")
        raise Rejected(f"you reported 0 for {name}, but the ranks' gradients differ by up "
                       f"to {want[name]:.4g}.{why}")
    name = wrong[0]
    if all(math.isclose(got[k], from_rank0[k], rel_tol=1e-5) for k in wrong):
        raise Rejected(f"{name}: you reported {got[name]:.4g}, the largest difference from "
                       f"rank 0's gradient; between ranks 1 and 2 it is {want[name]:.4g}. "
                       "Take the largest minus the smallest value over all ranks.")
    raise Rejected(f"{name}: you reported {got[name]:.4g}, expected {want[name]:.4g} (the "
                   "largest, over its elements, of the largest minus the smallest value over "
                   "ranks).")


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
