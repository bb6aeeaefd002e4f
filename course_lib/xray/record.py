"""What the probes write: one list of events per rank, each stamped with the learner's line.

Probes call `note(kind, **fields)`. The events go home under the collector COLLECTOR
(course_lib.collectors): the list with the rank's result, its error or its last words, and
each event journaled as it is noted, so that a rank killed by a signal (gloo's size check
aborts it) still leaves its events up to then (as noted: a data pass's batches come later).
Nothing here imports the launcher.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

import torch

from course_lib import collectors

COLLECTOR = "xray"  # the name the rank's events travel under (Run.extras[rank][COLLECTOR])

# Frames in these folders are not the learner's: torch, the course's own code, the stdlib.
_NOT_OWN = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_PACKAGES = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)

_events: list[dict[str, Any]] = []
_PROBES = "course_lib.xray.probes."
T = TypeVar("T")


def is_own(filename: str) -> bool:
    """True when a frame's file is the learner's code (not torch, course_lib or a library)."""
    if filename.startswith("<") or filename.startswith(_NOT_OWN) or filename.startswith(_STDLIB):
        return False
    return not any(p in filename for p in _PACKAGES)


def where(skip: int = 1) -> str:
    """The learner's "file:line" that led here: the innermost frame in the learner's code."""
    frame: FrameType | None = sys._getframe(skip)
    while frame is not None:
        name = frame.f_code.co_filename
        if is_own(name):
            return location(name, frame.f_lineno)
        frame = frame.f_back
    return ""


def location(path: str, line: int) -> str:
    """"file:line", the path relative to the working folder when it lies inside it."""
    rel = os.path.relpath(path)
    return f"{path if rel.startswith('..') else rel}:{line}"


def note(kind: str, where_: str | None = None, **fields: Any) -> dict[str, Any]:
    """Append one event for this rank, journal it, and return it (a probe may add to it
    later, e.g. a data loader pass its batches); `where_` overrides the learner's line."""
    return _append({"kind": kind, "where": where(2) if where_ is None else where_,
                    "t": time.monotonic(), **fields})


def _append(event: dict[str, Any]) -> dict[str, Any]:
    _events.append(event)
    collectors.journal(COLLECTOR, event)  # a no-op outside a launched rank
    return event


def tag(obj: object, name: str, value: object) -> None:
    """Keep a probe's bookkeeping on a torch object (a DataLoader, an optimizer, a module) as
    the attribute `_xray_<name>`, past any __setattr__ of its own (nn.Module's, DataLoader's)."""
    object.__setattr__(obj, f"_xray_{name}", value)


def tagged(obj: object, name: str, kind: type[T]) -> T | None:
    """What tag() kept on `obj` under `name`, when it is a `kind` (else None)."""
    value = getattr(obj, f"_xray_{name}", None)
    return value if isinstance(value, kind) else None


def events() -> list[dict[str, Any]]:
    """This rank's events so far, in order."""
    return _events


def clear() -> None:
    """Forget this rank's events (a fresh x-ray in the same process)."""
    _events.clear()


@contextmanager
def guard(probe: str = "", installing: bool = False) -> Iterator[None]:
    """Around a probe's own bookkeeping (or its installation): a failure there must never
    break the learner's run; it is kept as a "probe_error" event naming the probe module
    (`probe`, else the probe module on the stack), once per error text, and the rules that
    probe feeds say "not judged"."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - any bug of ours: note it, run on
        text = f"{type(exc).__name__}: {exc}"[:200]
        if not any(e["kind"] == "probe_error" and e["error"] == text for e in _events):
            _append({"kind": "probe_error", "where": "", "t": time.monotonic(),
                     "error": text, "probe": probe or _probe_module(),
                     "installing": installing})


def _probe_module() -> str:
    """The probe whose bookkeeping failed: "ddp" for course_lib.xray.probes.ddp."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith(_PROBES):
            return str(name[len(_PROBES):])
        frame = frame.f_back
    return ""
