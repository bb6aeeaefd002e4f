"""Probes: each watches one area of a rank's run and writes events (record.note; their
kinds and fields are in xray/events.py).

Each module has install(), run inside every rank before the learner's code; it patches
only inside that worker process. Importing a module patches nothing.
"""

from __future__ import annotations

from course_lib.xray.probes import amp, checkpoint, collectives, data, ddp, optim, output, spawn

PROBES = (data, output, collectives, ddp, optim, checkpoint, amp, spawn)  # install order

_installed = False


def install_all() -> None:
    """Install every probe, once per process."""
    global _installed
    if _installed:
        return
    _installed = True
    for probe in PROBES:
        probe.install()
