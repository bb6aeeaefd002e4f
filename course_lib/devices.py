"""The course's one rule for devices and backends, and for timing on them.

NCCL when the machine has a GPU for each of its ranks, each rank on cuda:LOCAL_RANK;
otherwise gloo, every rank on the CPU. A launch's ranks see the GPUs its `env` leaves them
(CUDA_VISIBLE_DEVICES). On a GPU, work runs after Python has queued it, so a timestamp
waits for the GPU first.

The launcher, each rank, own_init, the telemetry, the lessons' helpers and the checks' hints
ask this module; `python -m course_lib export` copies its functions into the script it
writes, so the script and the library cannot drift. Hence torch and the standard library
only, and no annotation a script without `from __future__ import annotations` cannot run.
"""

import os
import re
from collections.abc import Callable

import torch
import torch.distributed as dist

# The rule in one sentence, for hints and messages.
RULE = ("NCCL, each rank on cuda:LOCAL_RANK, only when the machine has a GPU for each of its "
        "ranks (int(os.environ['LOCAL_WORLD_SIZE']) <= torch.cuda.device_count()); else "
        "gloo, every rank on the CPU")


# -- which GPUs, which backend, which device ------------------------------------------------

def named_gpus(value: str) -> "list[int] | list[str]":
    """The GPUs a CUDA_VISIBLE_DEVICES value names, read as torch reads it before CUDA starts
    (torch/cuda/__init__.py, _parse_visible_devices): ordinals, or GPU-/MIG- UUIDs, separated
    by commas, up to the first entry that is not one; "" names none, nor does a list that
    repeats an entry."""
    if value.startswith(("GPU-", "MIG-")):
        uuids: list[str] = []
        for entry in value.split(","):
            if entry in uuids:
                return []
            if not entry.startswith(value[:4]):
                break
            uuids.append(entry)
        return uuids
    ordinals: list[int] = []
    for entry in value.split(","):
        number = re.match(r"\+?(\d+)", entry.strip())  # "1gpu" reads as 1, as in C's strtoul
        if number is None:
            break  # "", "-1", "none": the list ends here
        if int(number[1]) in ordinals:
            return []
        ordinals.append(int(number[1]))
    return ordinals


def visible_gpus(env: dict | None = None) -> int:
    """How many GPUs a process started from this one, with `env` added to its environment,
    sees: this process's count, or what the CUDA_VISIBLE_DEVICES in `env` leaves of it
    (counted against the GPUs this process sees, so never more). torch.cuda.device_count()
    asks NVML before CUDA starts, so asking initialises no CUDA here."""
    here = torch.cuda.device_count()
    value = (env or {}).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return here
    named = named_gpus(str(value))
    if named and isinstance(named[0], int):  # CUDA stops at the first GPU that is not there
        return next((i for i, gpu in enumerate(named) if gpu >= here), len(named))
    return min(len(named), here)


def backend_for(ranks_on_node: int, gpus: int) -> str:
    """"nccl" when the machine has a GPU for each of its ranks, else "gloo"."""
    return "nccl" if 0 < ranks_on_node <= gpus else "gloo"


def device_for(backend: str, local_rank: int) -> torch.device:
    """cuda:LOCAL_RANK under NCCL (one GPU per rank), else the CPU."""
    return torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")


def bind(backend: str, local_rank: int) -> "torch.device | None":
    """Under NCCL, make cuda:LOCAL_RANK this process's GPU before its group starts, and return
    it (init_process_group's device_id binds the group to it, lesson 02); None on gloo."""
    if backend != "nccl":
        return None
    device = device_for(backend, local_rank)
    torch.cuda.set_device(device)
    return device


def rank_device() -> torch.device:
    """This rank's device: cuda:LOCAL_RANK when its process group uses NCCL, else the CPU."""
    backend = dist.get_backend() if dist.is_initialized() else "gloo"
    return device_for(backend, int(os.environ.get("LOCAL_RANK", 0)))


def torchrun_backend() -> str:
    """The backend for a process that torchrun started: NCCL, bound to cuda:LOCAL_RANK, when
    its machine has a GPU for each of its processes (LOCAL_WORLD_SIZE), else gloo on the
    CPU, said in one line per machine."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))  # processes on this machine
    gpus = torch.cuda.device_count()
    backend = backend_for(here, gpus)
    bind(backend, local_rank)
    if backend == "gloo" and local_rank == 0:
        print(f"gloo on the CPU: {gpus} GPU(s) for {here} processes on this node", flush=True)
    return backend


# -- timing ---------------------------------------------------------------------------------

def wait_for_gpu() -> None:
    """Wait until this process's GPU has run everything queued on it, so that a timestamp
    taken next marks when the work ran, not when Python queued it. Nothing in a process
    that never used CUDA (every gloo rank of the course): it never starts CUDA."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


_anchor: "tuple[float, torch.cuda.Event] | None" = None  # (clock's time, event) at a synchronize


def start_gpu_clock(clock: Callable[[], float]) -> None:
    """Tie the GPU's timer to `clock`, once per process: an event recorded right after a
    synchronize runs at once, at `clock()`. GpuTime does it on first use; a watcher calls it
    when it is installed, so that the synchronize happens before training, not inside it."""
    global _anchor
    if _anchor is None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        _anchor = (clock(), event)


class GpuTime:
    """A timestamp of the point the current CUDA stream has reached, taken without waiting:
    a CUDA event recorded now. float() waits until the GPU has passed it and gives its time
    on `clock`, counted from the anchor (start_gpu_clock)."""

    __slots__ = ("event",)

    def __init__(self, clock: Callable[[], float]) -> None:
        start_gpu_clock(clock)
        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record()

    def __float__(self) -> float:
        self.event.synchronize()
        assert _anchor is not None  # set by __init__, in a process that uses CUDA
        seconds, anchor = _anchor
        return seconds + anchor.elapsed_time(self.event) / 1e3


def timestamp(clock: Callable[[], float]) -> "float | GpuTime":
    """Now on `clock`; in a process that uses CUDA, a GpuTime instead: when the GPU reaches
    this point of its queue (float() reads it), without waiting for it here."""
    return GpuTime(clock) if torch.cuda.is_initialized() else clock()
