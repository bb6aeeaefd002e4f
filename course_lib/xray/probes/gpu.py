"""Probe: what the learner's code asked about GPUs (torch.cuda.device_count(),
is_available(), torch.accelerator's) and the answer, and the process group it asked for
(init_process_group's backend and world size).

A script that takes its world size from device_count(), stops when is_available() is
False, or asks for NCCL does nothing on a CPU machine; these let the x-ray's first line say
why (xray/cause.py). Calls from torch's own code are not noted.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from course_lib.xray import record
from course_lib.xray.probes.patching import Patch, apply


def patches() -> list[Patch]:
    """The GPU queries, in torch.cuda and torch.accelerator, and init_process_group (in
    torch.distributed and c10d: the launch's own, which keeps the launch's group)."""
    cuda = [Patch(torch.cuda, name, _query(f"torch.cuda.{name}"))
            for name in ("device_count", "is_available")]
    accelerator = [Patch(torch.accelerator, name, _query(f"torch.accelerator.{name}"))
                   for name in ("device_count", "is_available", "current_accelerator")]
    return cuda + accelerator + [Patch(dist, "init_process_group", _init),
                                 Patch(c10d, "init_process_group", _init)]


def install() -> None:
    apply(patches())


def _query(call: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(real: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(real)
        def query(*args: Any, **kwargs: Any) -> Any:
            answer = real(*args, **kwargs)
            if record.is_own(sys._getframe(1).f_code.co_filename):
                with record.guard():
                    _note(call, answer)
            return answer
        return query
    return wrap


def _note(call: str, answer: Any) -> None:
    """Note each (call, line, answer) once: a loop that asks every step adds nothing."""
    where, call, result = record.where(3), f"{call}()", repr(answer)
    if not any(e["kind"] == "gpu_query" and (e["where"], e["call"], e["result"]) ==
               (where, call, result) for e in record.events()):
        record.note("gpu_query", where, call=call, result=result)


def _init(real: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(real)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        with record.guard():
            world_size = kwargs.get("world_size", args[2] if len(args) > 2 else -1)
            record.note("init_process_group", backend=str(backend or "").lower(),
                        world_size=int(world_size if world_size is not None else -1))
        return real(backend, *args, **kwargs)
    return init_process_group
