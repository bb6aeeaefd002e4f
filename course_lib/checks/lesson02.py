"""Checks for lesson 02's exercises: each rank picks its own device (cuda:LOCAL_RANK when its
machine has a GPU for each of its ranks, else the CPU), and a training step puts everything it
uses on that device.

No GPU is needed. The device check runs the learner's function on ranks laid out as machines
(the environment torchrun would give them, torch.cuda and torch.accelerator answering as
there): 2 machines x 2 GPUs, 1 machine x 3 GPUs, 2 ranks on 1 GPU (fewer GPUs than ranks: the
CPU, as launch's backend="auto" chooses), no GPU. The placement check uses the meta device as
the "other device", as the lesson does, and compares what the returned objects compute on the
CPU with what the given ones compute, so that a new object in place of a moved one is caught.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course_lib.checks.common import (
    CHECK_TIMEOUT,
    WORLD_SIZES,
    Rejected,
    at_world_sizes,
    close,
    listing,
    on_ranks,
    run_check,
    same,
)
from course_lib.checks.result import CheckResult
from course_lib.teach import placement

# world size -> (GPUs, ranks) per machine: a GPU per rank, 2 machines x 2 GPUs, 1 x 3 GPUs
GPU_LAYOUTS = {4: (2, 2), 3: (3, 3)}
SHORT_OF_GPUS = (2, 1)  # 2 ranks on 1 machine with 1 GPU: the CPU on every rank
NO_GPU_WORLD_SIZE = 2
DEVICE = "meta"  # the stand-in for cuda:LOCAL_RANK in the placement check
CPU_RULE = ("When a machine has fewer GPUs than ranks (torch.cuda.device_count() < "
            "LOCAL_WORLD_SIZE), every rank uses the CPU: the job runs on gloo, as "
            "launch(backend='auto') chooses.")


# -- pick_device() -> torch.device ------------------------------------------------------------

def _pretend_gpus(count: int) -> list[int]:
    """Make torch.cuda and torch.accelerator answer as on a machine with `count` GPUs;
    returns the list that records each set_device call."""
    calls: list[int] = []

    def set_device(device: Any) -> None:
        index = device if isinstance(device, int) else torch.device(device).index
        calls.append(0 if index is None else index)

    def current() -> int:
        return calls[-1] if calls else 0

    torch.cuda.is_available = lambda: count > 0
    torch.cuda.device_count = lambda: count
    torch.cuda.set_device = set_device
    torch.cuda.current_device = current
    acc = torch.accelerator
    acc.is_available = lambda: count > 0
    acc.device_count = lambda: count
    acc.current_accelerator = lambda check_available=False: (
        torch.device("cuda") if count > 0 else None)
    acc.set_device_index = acc.set_device_idx = set_device
    acc.current_device_index = acc.current_device_idx = current
    return calls


def _device_on_rank(fn: Callable, gpus: int, per_machine: int) -> tuple[str, Any, list[int]]:
    """Run fn() as rank RANK of a torchrun job on machines with `gpus` GPUs and
    `per_machine` ranks each."""
    rank = dist.get_rank()
    os.environ.update(LOCAL_RANK=str(rank % per_machine), GROUP_RANK=str(rank // per_machine),
                      LOCAL_WORLD_SIZE=str(per_machine))
    calls = _pretend_gpus(gpus)
    got = fn()
    if isinstance(got, int):  # torch.device(1) is cuda:1 on a CUDA build, an error on a CPU
        return "", got, calls  # build: a bare number is no answer on every machine
    try:
        return str(torch.device(got)), None, calls
    except (TypeError, RuntimeError):
        return "", got, calls


def check_pick_device(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn() must return cuda:LOCAL_RANK on machines with a GPU for each of their ranks (2
    machines x 2 GPUs, then 1 machine x 3 GPUs), and the CPU on a machine with fewer GPUs
    than ranks (2 ranks, 1 GPU) or without one."""
    def judge() -> str:
        for n, results in at_world_sizes(_device_on_rank, fn, tuple(GPU_LAYOUTS),
                                         args=lambda n: GPU_LAYOUTS[n], timeout=timeout):
            _judge_gpus(results, GPU_LAYOUTS[n][0])
        n, gpus = SHORT_OF_GPUS
        _judge_short_of_gpus(on_ranks(_device_on_rank, fn, n, (gpus, n), timeout), gpus)
        _judge_no_gpu(on_ranks(_device_on_rank, fn, NO_GPU_WORLD_SIZE,
                               (0, NO_GPU_WORLD_SIZE), timeout))
        return ("on 2 machines x 2 GPUs, ranks 0-3 chose cuda:0, cuda:1, cuda:0, cuda:1; on 1 "
                "machine x 3 GPUs, cuda:0, cuda:1, cuda:2 (their LOCAL_RANK); with 2 ranks on "
                "1 GPU, and without a GPU, the CPU.")
    return run_check("check_pick_device", fn, judge)


def _layout(n: int, gpus: int) -> str:
    machines = n // gpus
    if machines == 1:
        return f"1 machine with {gpus} GPUs (ranks {listing(range(n))})"
    return (f"{machines} machines with {gpus} GPUs each (ranks {listing(range(gpus))} on "
            f"machine 0; ranks {listing(range(gpus, n))} on machine 1)")


def _judge_gpus(results: list[tuple[str, Any, list[int]]], gpus: int) -> None:
    n = len(results)
    chosen = [_resolved(rank, device, got, calls)
              for rank, (device, got, calls) in enumerate(results)]
    want = [f"cuda:{r % gpus}" for r in range(n)]
    if chosen == want:
        return
    layout = _layout(n, gpus)
    if all(c == "cpu" for c in chosen):
        raise Rejected(f"on {layout}, every rank chose the CPU, though each machine has a GPU "
                       "for each of its ranks. When torch.cuda.device_count() >= "
                       "LOCAL_WORLD_SIZE (the ranks on this machine, not WORLD_SIZE), use the "
                       "GPU numbered by LOCAL_RANK.")
    if len(set(chosen)) == 1:
        raise Rejected(f"on {layout}, every rank chose {chosen[0]}: the ranks of a machine "
                       "pile onto one GPU (with NCCL: \"Duplicate GPU detected\"). Use "
                       "int(os.environ['LOCAL_RANK']) as the GPU number.")
    if chosen == [f"cuda:{r}" for r in range(n)]:
        raise Rejected(f"on {layout}, ranks {listing(range(gpus, n))} chose "
                       f"{listing(chosen[gpus:])}, GPUs their machine does not have: that is "
                       "the global RANK. Use LOCAL_RANK, the rank within the machine.")
    for k in range(2, n):
        if k != gpus and chosen == [f"cuda:{r % k}" for r in range(n)]:
            raise Rejected(f"on {layout}, the GPU number repeats every {k} ranks "
                           f"({', '.join(chosen)}): a fixed {k} where the number of GPUs per "
                           "machine belongs. Use LOCAL_RANK, which torchrun sets for you.")
    wrong = [f"rank {r} chose {c} (LOCAL_RANK {r % gpus})"
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


def _judge_short_of_gpus(results: list[tuple[str, Any, list[int]]], gpus: int) -> None:
    """Fewer GPUs than ranks on the machine: every rank must choose the CPU."""
    n = len(results)
    chosen = [_resolved(rank, device, got, calls)
              for rank, (device, got, calls) in enumerate(results)]
    if all(c == "cpu" for c in chosen):
        return
    layout = f"1 machine with {gpus} GPU and {n} ranks"
    for rank, c in enumerate(chosen):
        if c.startswith("cuda:") and int(c.split(":")[1]) >= gpus:
            raise Rejected(f"on {layout}, rank {rank} chose {c}, a GPU this machine does not "
                           f"have (CUDA: \"invalid device ordinal\"). {CPU_RULE}")
    if "cpu" not in chosen:
        raise Rejected(f"on {layout}, the ranks chose {', '.join(chosen)}: {n} ranks share "
                       f"{gpus} GPU (NCCL refuses: \"Duplicate GPU detected\"). {CPU_RULE}")
    raise Rejected(f"on {layout}, the ranks chose {', '.join(chosen)}: a GPU for some, the "
                   f"CPU for others, and NCCL needs a GPU on every rank. {CPU_RULE}")


def _judge_no_gpu(results: list[tuple[str, Any, list[int]]]) -> None:
    for rank, (device, got, _) in enumerate(results):
        if not device:
            raise Rejected(f"rank {rank}'s pick_device() returned {got!r}, which is not a "
                           "device; return a torch.device.")
        if device != "cpu":
            raise Rejected(f"on a machine without GPUs, rank {rank} chose {device}: fall back "
                           "to torch.device('cpu') when torch.cuda.device_count() is 0.")


# -- to_device(model, loss_fn, x, y, device) -> (model, loss_fn, x, y) -------------------------

def step_parts() -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor]:
    """A model with a buffer (BatchNorm), a weighted loss and a batch, all on the CPU."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    loss_fn = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 4.0]))
    return model, loss_fn, torch.randn(16, 6), torch.randint(0, 3, (16,))


def _placement_on_rank(fn: Callable, device: str) -> dict:
    """Where fn put everything on `device`, whether a step runs there, and what the returned
    objects compute on the CPU next to what the given ones compute."""
    out = fn(*step_parts(), device)
    if not _four(out):
        return {"returned": repr(out)[:80]}
    model, loss_fn, x, y = out
    snap = placement.snapshot(model, device=device, inputs=x, targets=y, loss_fn=loss_fn)
    try:
        loss_fn(model(x), y).backward()
        error = ""
    except RuntimeError as exc:
        error = str(exc).splitlines()[0]
    return {"snapshot": snap, "error": error, "values": _values_on_cpu(fn)}


def _four(out: Any) -> bool:
    return isinstance(out, (tuple, list)) and len(out) == 4


def _values_on_cpu(fn: Callable) -> dict:
    """With device="cpu" every .to() is a no-op, so the returned objects must compute exactly
    what the given ones do: a new model, loss or batch in their place shows up here."""
    model, loss_fn, x, y = step_parts()
    with torch.no_grad():
        want = {"outputs": model(x), "loss": loss_fn(model(x), y), "x": x.clone(), "y": y.clone()}
    out = fn(*step_parts(), "cpu")
    if not _four(out):
        return {"returned": repr(out)[:80]}
    got_model, got_loss_fn, got_x, got_y = out
    with torch.no_grad():
        got = {"outputs": got_model(x), "loss": got_loss_fn(want["outputs"], y)}
    return {"want_loss": float(want["loss"]), "got_loss": float(got["loss"]),
            "loss_has_weight": getattr(got_loss_fn, "weight", None) is not None,
            "same_model": same(got["outputs"], want["outputs"]),
            "same_x": same(got_x, want["x"]), "same_y": same(got_y, want["y"])}


def check_to_device(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn(model, loss_fn, x, y, device) must return (model, loss_fn, x, y), the objects it
    was given, with everything on `device` (meta stands in for a GPU); then one training
    step must run there. Run on 2 and on 3 ranks."""
    def judge() -> str:
        for _, results in at_world_sizes(_placement_on_rank, fn, WORLD_SIZES, (DEVICE,),
                                         timeout):
            _judge_placement(results)
        return (f"on {listing(WORLD_SIZES)} ranks the model's parameters and buffers, the "
                f"loss's weight, the inputs and the targets are on {DEVICE}, a training step "
                "runs there, and they are the objects to_device() was given.")
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
    n = len(results)
    for rank, got in enumerate(results):
        if "returned" in got:
            raise Rejected(f"rank {rank}: to_device() returned {got['returned']}; return the "
                           "four things it was given, moved: (model, loss_fn, x, y).")
    diagnosis = placement.diagnose([got["snapshot"] for got in results])
    if diagnosis.misplaced or diagnosis.split:
        rank, item, where = (diagnosis.split or diagnosis.misplaced)[0]
        hint = HINTS.get(item, f"move {item} with .to(device)")
        raise Rejected(f"with {n} ranks, rank {rank}: {item} on {where}, not on {DEVICE}: "
                       f"{hint}.")
    for rank, got in enumerate(results):
        if got["error"]:
            raise Rejected(f"with {n} ranks, everything is on {DEVICE}, but rank {rank}'s "
                           f"training step failed: {got['error']}")
    _judge_values(results[0]["values"])


def _judge_values(values: dict) -> None:
    """The objects returned must be the ones given (moved), not new ones."""
    if "returned" in values:
        raise Rejected(f"with device='cpu', to_device() returned {values['returned']}; return "
                       "(model, loss_fn, x, y).")
    if not values["same_model"]:
        raise Rejected("the model to_device() returned is not the one it was given: its "
                       "outputs differ (a new model has new weights). Move the given model: "
                       "model.to(device).")
    if not close(values["got_loss"], values["want_loss"]):
        missing = ("; it has no class weight: a new nn.CrossEntropyLoss() in place of the "
                   "weighted one" if not values["loss_has_weight"] else "")
        raise Rejected(f"the loss function to_device() returned is not the one it was given: "
                       f"on the same outputs it gives {values['got_loss']:.4f} instead of "
                       f"{values['want_loss']:.4f}{missing}. Move the given loss, "
                       "loss_fn.to(device), which moves its weight.")
    for name in ("x", "y"):
        if not values[f"same_{name}"]:
            raise Rejected(f"the {name} to_device() returned holds other values than the {name} "
                           f"it was given: return {name}.to(device), the given batch moved.")
