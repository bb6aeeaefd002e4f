"""Checks for lesson 02's exercises: each rank picks its own device (LOCAL_RANK, with a CPU
fallback), and a training step puts everything it uses on that device.

No GPU is needed. The device check runs the learner's function on ranks laid out as two
machines with two GPUs each (the environment torchrun would give them, with torch.cuda
answering as if each machine had 2 GPUs), then on ranks with no GPU. The placement check
uses PyTorch's meta device as the "other device", as the lesson does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, on_ranks, run_check
from course_lib.checks.result import CheckResult
from course_lib.teach import placement

MACHINES, GPUS_PER_MACHINE = 2, 2
NO_GPU_WORLD_SIZE = 2
DEVICE = "meta"  # the stand-in for cuda:LOCAL_RANK in the placement check


# -- pick_device() -> torch.device ------------------------------------------------------------

def _pretend_gpus(count: int) -> list[int]:
    """Make torch.cuda answer as on a machine with `count` GPUs; returns the list that
    records each torch.cuda.set_device() call."""
    calls: list[int] = []

    def set_device(device: Any) -> None:
        index = torch.device(device).index if not isinstance(device, int) else device
        calls.append(0 if index is None else index)

    torch.cuda.is_available = lambda: count > 0
    torch.cuda.device_count = lambda: count
    torch.cuda.set_device = set_device
    torch.cuda.current_device = lambda: calls[-1] if calls else 0
    return calls


def _device_on_rank(fn: Callable, gpus: int) -> tuple[str, Any, list[int]]:
    """Run fn() as rank RANK of a torchrun job on machines with `gpus` GPUs each."""
    rank = dist.get_rank()
    if gpus:
        os.environ.update(LOCAL_RANK=str(rank % gpus), GROUP_RANK=str(rank // gpus),
                          LOCAL_WORLD_SIZE=str(gpus))
    calls = _pretend_gpus(gpus)
    got = fn()
    try:
        return str(torch.device(got)), None, calls
    except (TypeError, RuntimeError):
        return "", got, calls


def check_pick_device(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn() must return cuda:LOCAL_RANK on machines with GPUs (2 machines x 2 GPUs here),
    and the CPU on a machine without one."""
    def judge() -> str:
        n = MACHINES * GPUS_PER_MACHINE
        _judge_gpus(on_ranks(_device_on_rank, fn, n, (GPUS_PER_MACHINE,), timeout))
        _judge_no_gpu(on_ranks(_device_on_rank, fn, NO_GPU_WORLD_SIZE, (0,), timeout))
        return (f"on {MACHINES} machines x {GPUS_PER_MACHINE} GPUs, ranks 0-{n - 1} chose "
                f"cuda:0, cuda:1, cuda:0, cuda:1 (their LOCAL_RANK); without a GPU, the CPU.")
    return run_check("check_pick_device", fn, judge)


def _judge_gpus(results: list[tuple[str, Any, list[int]]]) -> None:
    chosen = [_resolved(rank, device, got, calls)
              for rank, (device, got, calls) in enumerate(results)]
    want = [f"cuda:{r % GPUS_PER_MACHINE}" for r in range(len(results))]
    if chosen == want:
        return
    layout = (f"{MACHINES} machines with {GPUS_PER_MACHINE} GPUs each (ranks 0, 1 on machine "
              f"0; ranks 2, 3 on machine 1)")
    if all(c == "cpu" for c in chosen):
        raise Rejected(f"on {layout}, every rank chose the CPU. When "
                       "torch.cuda.is_available(), use the GPU numbered by LOCAL_RANK.")
    if len(set(chosen)) == 1:
        raise Rejected(f"on {layout}, every rank chose {chosen[0]}: the ranks of a machine "
                       "pile onto one GPU while the other sits idle. Use "
                       "int(os.environ['LOCAL_RANK']) as the GPU number.")
    if chosen == [f"cuda:{r}" for r in range(len(results))]:
        raise Rejected(f"on {layout}, ranks 2 and 3 chose cuda:2 and cuda:3, GPUs their "
                       "machine does not have: that is the global RANK. Use LOCAL_RANK, the "
                       "rank within the machine.")
    wrong = [f"rank {r} chose {c} (LOCAL_RANK {r % GPUS_PER_MACHINE})"
             for r, (c, w) in enumerate(zip(chosen, want)) if c != w]
    raise Rejected(f"on {layout}: {'; '.join(wrong)}. Each rank's GPU is cuda:LOCAL_RANK.")


def _resolved(rank: int, device: str, got: Any, calls: list[int]) -> str:
    """The device the rank will really use: 'cuda' alone means the current GPU."""
    if not device:
        raise Rejected(f"rank {rank}'s pick_device() returned {got!r}, which is not a device; "
                       "return a torch.device (or a string such as 'cuda:1').")
    if device == "cuda":
        return f"cuda:{calls[-1] if calls else 0}"
    return device


def _judge_no_gpu(results: list[tuple[str, Any, list[int]]]) -> None:
    for rank, (device, got, _) in enumerate(results):
        if not device:
            raise Rejected(f"rank {rank}'s pick_device() returned {got!r}, which is not a "
                           "device; return a torch.device.")
        if device != "cpu":
            raise Rejected(f"on a machine without GPUs, rank {rank} chose {device}: fall back "
                           "to torch.device('cpu') when torch.cuda.is_available() is False.")


# -- to_device(model, loss_fn, x, y, device) -> (model, loss_fn, x, y) -------------------------

def step_parts() -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor]:
    """A model with a buffer (BatchNorm), a weighted loss and a batch, all on the CPU."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    loss_fn = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 4.0]))
    return model, loss_fn, torch.randn(16, 6), torch.randint(0, 3, (16,))


def _placement_on_rank(fn: Callable, device: str) -> dict:
    out = fn(*step_parts(), device)
    if not isinstance(out, (tuple, list)) or len(out) != 4:
        return {"returned": repr(out)[:80]}
    model, loss_fn, x, y = out
    snap = placement.snapshot(model, device=device, inputs=x, targets=y, loss_fn=loss_fn)
    try:
        loss_fn(model(x), y).backward()
        error = ""
    except RuntimeError as exc:
        error = str(exc).splitlines()[0]
    return {"snapshot": snap, "error": error}


def check_to_device(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn(model, loss_fn, x, y, device) must return (model, loss_fn, x, y) with everything
    on `device` (meta stands in for a GPU); then one training step must run there."""
    def judge() -> str:
        results = on_ranks(_placement_on_rank, fn, 2, (DEVICE,), timeout)
        _judge_placement(results)
        return (f"on both ranks the model's parameters and buffers, the loss's weight, the "
                f"inputs and the targets are on {DEVICE}, and a training step runs there.")
    return run_check("check_to_device", fn, judge)


HINTS = {
    "inputs": "a tensor's .to() returns a copy and leaves the original where it was: "
              "x = x.to(device)",
    "targets": "the targets must be on the device too, and a tensor's .to() returns a copy: "
               "y = y.to(device)",
    "loss_fn buffers": "the loss's class weight is a buffer created on the CPU: move the loss "
                       "with loss_fn.to(device)",
    "model parameters": "move the whole model with model.to(device) (a module moves in place)",
    "model buffers": "the model's buffers (BatchNorm's running statistics) stayed behind: "
                     "model.to(device) moves parameters and buffers",
}


def _judge_placement(results: list[dict]) -> None:
    for rank, got in enumerate(results):
        if "returned" in got:
            raise Rejected(f"rank {rank}: to_device() returned {got['returned']}; return the "
                           "four things it was given, moved: (model, loss_fn, x, y).")
    diagnosis = placement.diagnose([got["snapshot"] for got in results])
    if diagnosis.misplaced or diagnosis.split:
        rank, item, where = (diagnosis.split or diagnosis.misplaced)[0]
        hint = HINTS.get(item, f"move {item} with .to(device)")
        raise Rejected(f"rank {rank}: {item} on {where}, not on {DEVICE}: {hint}.")
    if results[0]["error"]:
        raise Rejected(f"everything is on {DEVICE}, but a training step failed: "
                       f"{results[0]['error']}")
