"""`check_pick_device` for lesson 02's first exercise: each rank picks its own device,
cuda:LOCAL_RANK when its machine has a GPU for each of its ranks, else the CPU.

No GPU is needed: the learner's function runs on ranks laid out as machines (the environment
torchrun would give them, torch.cuda and torch.accelerator answering as there): 2 machines x
2 GPUs, 1 machine x 3 GPUs, 2 ranks on 1 GPU (fewer GPUs than ranks: the CPU, as launch's
backend="auto" chooses), no GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from course_lib import devices
from course_lib.checks.common import CHECK_TIMEOUT, Rejected, at_world_sizes, check, on_ranks
from course_lib.words import listing

# world size -> (GPUs, ranks) per machine: a GPU per rank, 2 machines x 2 GPUs, 1 x 3 GPUs
GPU_LAYOUTS = {4: (2, 2), 3: (3, 3)}
SHORT_OF_GPUS = (2, 1)  # 2 ranks on 1 machine with 1 GPU: the CPU on every rank
NO_GPU_WORLD_SIZE = 2
CPU_RULE = f"The rule, which launch(backend='auto') follows: {devices.RULE}."


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


@check
def check_pick_device(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn() must return cuda:LOCAL_RANK on machines with a GPU for each of their ranks (2
    machines x 2 GPUs, then 1 machine x 3 GPUs), and the CPU on a machine with fewer GPUs
    than ranks (2 ranks, 1 GPU) or without one."""
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
