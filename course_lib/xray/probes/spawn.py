"""Probe: processes the learner's script starts itself with torch.multiprocessing.spawn
(`mp.spawn(main, nprocs=torch.cuda.device_count())` starts none on a CPU machine)."""

from __future__ import annotations

import functools
from typing import Any

import torch.multiprocessing as mp

from course_lib.xray import record


def install() -> None:
    """Note every mp.spawn / start_processes call with its process count."""
    mp.spawn = _spawn(mp.spawn)
    mp.start_processes = _spawn(mp.start_processes)


def _spawn(real: Any) -> Any:
    @functools.wraps(real)
    def spawn(fn: Any, args: tuple = (), nprocs: int = 1, *rest: Any, **kwargs: Any) -> Any:
        with record.guard():
            record.note("spawn", nprocs=int(nprocs), fn=getattr(fn, "__name__", ""))
        return real(fn, args, nprocs, *rest, **kwargs)
    return spawn
