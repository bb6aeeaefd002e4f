"""Probes: each watches one area of a rank's run and writes events (record.note; their
kinds and fields are in xray/events.py).

Each module has install(), run inside every rank before the learner's code; it patches
only inside that worker process, all of its patches or none (probes/patching.py).
Importing a module patches nothing.
"""

from __future__ import annotations

from types import ModuleType

from course_lib.xray import record
from course_lib.xray.probes import (
    amp,
    checkpoint,
    collectives,
    data,
    ddp,
    gpu,
    optim,
    output,
    pipeline,
    process,
    tensor_parallel,
)

PROBES: tuple[ModuleType, ...] = (data, output, collectives, ddp, optim, checkpoint, amp, process,
                                  gpu, tensor_parallel, pipeline)  # install order

_installed: set[str] = set()


def name(probe: ModuleType) -> str:
    """A probe's short name, as events.EVENTS names writers: "data"."""
    return probe.__name__.rsplit(".", 1)[1]


def install_all() -> None:
    """Install every probe, once per process. A probe that cannot be installed on this
    torch (a private name it wraps was renamed) leaves a probe_error with its reason and
    patches nothing; the rules it feeds are then "not judged", and the run goes on."""
    for probe in PROBES:
        if name(probe) in _installed:
            continue
        with record.guard(probe=name(probe), installing=True):
            probe.install()
            _installed.add(name(probe))
