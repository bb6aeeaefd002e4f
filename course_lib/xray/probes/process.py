"""Probe: how the script handles processes: mp.spawn (it would start ranks of its own) and
SystemExit (sys.exit(), exit(), an argument parser that stops it).

Under the x-ray each rank already is one of the job's processes, as under torchrun, so a
script's own mp.spawn is refused: `mp.spawn(main, nprocs=torch.cuda.device_count())`
starts none on a CPU machine, and with nprocs > 0 its processes would meet on the script's
own MASTER_PORT, unwatched by the probes, once per x-ray rank.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from course_lib.xray import record
from course_lib.xray.probes.patching import Patch, apply

REFUSED = ("the x-ray starts the ranks itself, as torchrun does: mp.spawn(..., nprocs={n}) "
           "would start {n} more process(es) per rank that the x-ray cannot watch")


def patches() -> list[Patch]:
    """mp.spawn and mp.start_processes."""
    return [Patch(mp, "spawn", _spawn), Patch(mp, "start_processes", _spawn)]


def install() -> None:
    """Note every mp.spawn / start_processes call with its process count, and refuse it."""
    apply(patches())


def _spawn(real: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(real)
    def spawn(fn: Any, args: tuple[Any, ...] = (), nprocs: int = 1, *rest: Any,
              **kwargs: Any) -> Any:
        with record.guard():
            record.note("spawn", nprocs=int(nprocs), fn=getattr(fn, "__name__", ""))
        if nprocs:
            raise RuntimeError(REFUSED.format(n=nprocs))
        return real(fn, args, nprocs, *rest, **kwargs)
    return spawn


def exited(exc: SystemExit) -> None:
    """Note a SystemExit that ends the learner's code (called by on_rank.observed): its
    code, the learner's line it came from, and the library that raised it, if any."""
    with record.guard():
        frames = []
        tb = exc.__traceback__
        while tb is not None:
            frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
            tb = tb.tb_next
        own = [(f, line) for f, line in frames if record.is_own(f)]
        raiser = frames[-1][0] if frames else ""
        library = "" if not raiser or record.is_own(raiser) else \
            os.path.splitext(os.path.basename(raiser))[0]
        record.note("exit", record.location(*own[-1]) if own else "", code=repr(exc.code),
                    library=library)
