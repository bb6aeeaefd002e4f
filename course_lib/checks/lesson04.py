"""Checks for lesson 04's exercises: wrap a multi-task model so that DDP can train it, and
measure how far the ranks' gradients are apart."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.checks.common import (
    CHECK_TIMEOUT,
    Rejected,
    at_world_sizes,
    close,
    differing,
    listing,
    run_check,
    state_snapshot,
)
from course_lib.checks.result import CheckResult

WRAP_WORLD_SIZES = (2, 3)
TASKS = "aabab"  # step 0 leaves head_b unused; the set of used heads changes from step 2 on
BATCH = 12  # per step, split evenly over 2 or 3 ranks (equal shards: DDP's mean is exact)
SEED = 4
DIFF_WORLD_SIZES = (2, 4)

# DDP's own error texts, caught on the rank, with what they mean for this job.
UNFINISHED = "Expected to have finished reduction"
GRAPH_CHANGED = "training graph has changed"


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


def train(model: nn.Module, forward: Callable, rank: int, world_size: int,
          progress: dict[str, Any] | None = None) -> None:
    """SGD over TASKS on this rank's share of every step's batch; `progress["step"]` says
    which step is running (so a crash can be placed). The batch goes where the model is: an
    answer that moves the model to the machine's GPU (right on a GPU box) trains there."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    device = next(model.parameters()).device
    for step, task in enumerate(TASKS):
        if progress is not None:
            progress["step"] = step
        x, y = (t.to(device) for t in task_batch(step))
        loss = nn.functional.cross_entropy(forward(x[rank::world_size], task),
                                           y[rank::world_size])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _wrap_on_rank(fn: Callable) -> dict[str, Any]:
    """fn(model) on this rank, then the job; what the learner's wrapper was and did."""
    torch.manual_seed(SEED)
    model = MultiTask()
    wrapped = fn(model)
    if not isinstance(wrapped, DDP):
        return {"type": type(wrapped).__name__}
    if wrapped.module is not model:
        return {"type": "DistributedDataParallel", "other_module": True}
    frozen = [k for k, p in model.named_parameters() if not p.requires_grad]
    progress: dict[str, Any] = {}
    try:
        train(model, wrapped, dist.get_rank(), dist.get_world_size(), progress)
    except RuntimeError as error:  # DDP's own refusals happen alike on every rank
        if UNFINISHED not in str(error) and GRAPH_CHANGED not in str(error):
            raise
        return {"type": "DistributedDataParallel", "frozen": frozen,
                "crash": str(error), "step": progress["step"]}
    return {"type": "DistributedDataParallel", "frozen": frozen,
            "weights": state_snapshot(model)}


def reference_weights() -> dict[str, torch.Tensor]:
    """The weights one process reaches training on the whole batches (run in the kernel,
    whose own random state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = MultiTask()
    train(model, model, 0, 1)
    return state_snapshot(model)


def check_wrap_model(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn(model) must return the model wrapped in DDP so that a job switching between the
    two heads trains on every rank exactly as one process does on the whole batches."""
    def judge() -> str:
        want = reference_weights()
        for n, results in at_world_sizes(_wrap_on_rank, fn, WRAP_WORLD_SIZES,
                                         timeout=timeout):
            _judge_wrap(results, want, n)
        return (f"trained {len(TASKS)} steps of tasks {', '.join(TASKS)} on "
                f"{listing(WRAP_WORLD_SIZES)} ranks; every rank's weights equal one "
                "process's.")
    return run_check("check_wrap_model", fn, judge)


def _unused_head(step: int) -> str:
    """The head that step `step` left without a gradient."""
    return "head_b" if TASKS[step] == "a" else "head_a"


def _judge_wrap(results: list[dict[str, Any]], want: dict[str, torch.Tensor], n: int) -> None:
    for rank, got in enumerate(results):
        if got["type"] != "DistributedDataParallel":
            raise Rejected(f"on rank {rank} wrap_model() returned a {got['type']}, not a "
                           "DistributedDataParallel: without DDP the ranks never average "
                           "their gradients. Return DDP(model, ...).")
        if got.get("other_module"):
            raise Rejected("the DDP you returned wraps another module, not the model you "
                           "were given: wrap `model` itself.")
    got = results[0]
    frozen = sorted({k.split(".")[0] for k in got["frozen"]})
    if "crash" in got:
        raise Rejected(_frozen_note(frozen) + _crash_hint(got, n))
    for rank, mine in enumerate(results):
        wrong = differing(mine["weights"], want)
        if not wrong:
            continue
        if frozen:
            raise Rejected(f"{_frozen_note(frozen)}after training, rank {rank}'s "
                           f"{', '.join(wrong)} differ from one process's. Use "
                           "find_unused_parameters=True instead.")
        raise Rejected(f"after training on {n} ranks, rank {rank}'s {', '.join(wrong)} differ "
                       "from what one process computes on the whole batches. Pass the model "
                       "to DDP unchanged, with find_unused_parameters=True.")


def _frozen_note(frozen: list[str]) -> str:
    """The learner froze parts that this job trains: say which, and at which steps."""
    if not frozen:
        return ""
    used = [str(s) for s, t in enumerate(TASKS) if f"head_{t}" in frozen or "body" in frozen]
    return (f"you froze {', '.join(frozen)} (requires_grad False), but this job trains it at "
            f"steps {', '.join(used)}: freezing is for a part the job never trains. Then ")


def _crash_hint(got: dict[str, Any], n: int) -> str:
    """What DDP's refusal at this step of this run means."""
    step, first = got["step"], got["crash"].splitlines()[0]
    if GRAPH_CHANGED in got["crash"]:
        return (f"on {n} ranks, training stopped at step {step} (task {TASKS[step]}): "
                f"\"{first[:90]}...\". static_graph=True promises that every step uses the "
                "same parameters, and this job switches between the heads. Use "
                "find_unused_parameters=True, which finds the unused ones every step.")
    return (f"on {n} ranks, training stopped at step {step} with DDP's \"{UNFINISHED} in the "
            f"prior iteration\": in step {step - 1} (task {TASKS[step - 1]}) "
            f"{_unused_head(step - 1)} got no gradient, so DDP never all-reduced its bucket. "
            "Tell DDP that some parameters may go unused: find_unused_parameters=True.")


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


def check_gradient_differences(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn(model), called on every rank after backward, must return on every rank
    {parameter name: largest absolute difference between any two ranks' gradients}."""
    def judge() -> str:
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
    return run_check("check_gradient_differences", fn, judge)


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
