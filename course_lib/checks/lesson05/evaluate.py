"""`check_evaluate` for lesson 05: after DDP training of a model with BatchNorm, rank 0 alone
calls the learner's evaluate(ddp_model, x, y) while the other ranks wait at a barrier. It must
return the eval-mode accuracy without hanging (a forward through the DDP wrapper broadcasts
buffers, a collective the waiting ranks never join) and leave the model training, unchanged."""

from __future__ import annotations

import copy
import numbers
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, at_world_sizes, check, state_snapshot
from course_lib.words import listing

SEED = 5
EVAL_WORLD_SIZES = (2, 3)
HANG_AFTER_S = 2.0  # seconds a collective waits before it fails: a hang ends fast


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
    batchnorm = cast(nn.Sequential, model.module)[1]
    batchnorm.register_forward_hook(lambda m, i, o: modes.append(m.training))
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


@check
def check_evaluate(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """After DDP training, rank 0 alone calls fn(ddp_model, x, y) while the other ranks wait
    at a barrier: it must return the eval-mode accuracy, without hanging, and leave the
    model in training mode with its state unchanged."""
    for n, results in at_world_sizes(_evaluate_on_rank, fn, EVAL_WORLD_SIZES,
                                     timeout=timeout, hang_after=HANG_AFTER_S,
                                     known=EVAL_ERRORS):
        try:
            want = _judge_evaluate(results[0])
        except Rejected as wrong:
            raise Rejected(f"on {n} ranks (rank 0 evaluating, the others waiting): "
                           f"{wrong}", kind=wrong.kind) from None
    return (f"on {listing(EVAL_WORLD_SIZES)} ranks, rank 0 evaluated on its own "
            f"(accuracy {want:.3f}, as in eval mode) while the others waited, and the "
            "model went back to training unchanged.")


def _judge_evaluate(report: dict[str, Any]) -> float:
    got, want, modes = report["got"], report["want"], report["modes"]
    if not isinstance(got, numbers.Real) or isinstance(got, bool):
        raise Rejected(f"evaluate() returned {got!r}; return the accuracy, a number between 0 "
                       "and 1 (e.g. tensor.item()).")
    if report["changed"]:
        raise Rejected(_changed_hint(report["changed"], modes))
    if abs(got - want) > 1e-6:
        raise Rejected(_accuracy_hint(float(got), want, report))
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
