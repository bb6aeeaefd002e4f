"""Probes: each watches one area of a rank's run and writes events (record.note).

Each module has install(), run inside every rank before the learner's code; it patches
only inside that worker process.
"""

from __future__ import annotations

import importlib

PROBES = ["data", "output", "collectives", "ddp", "optim", "checkpoint", "amp", "spawn"]

# The pitfall ids each probe's events feed: a probe that failed makes them unjudged.
FEEDS = {"data": ("P03", "P04", "P18", "P20", "X1", "X2"), "output": ("P16", "X2"),
         "collectives": ("S1", "X1", "X2", "X3"), "ddp": ("P05", "P09", "P10", "X3"),
         "optim": ("P08", "P09", "S3"), "checkpoint": ("P12", "P15"), "amp": ("S3",),
         "spawn": ()}

_installed = False


def install_all() -> None:
    """Install every probe (once per process); a probe that fails to import is an error,
    never silently left out."""
    global _installed
    if _installed:
        return
    _installed = True
    for name in PROBES:
        importlib.import_module(f"course_lib.xray.probes.{name}").install()
