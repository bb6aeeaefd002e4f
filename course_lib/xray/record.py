"""What the probes write: one list of events per rank, each stamped with the learner's line.

Probes call `note(kind, **fields)`; the x-ray sends `events()` home with the rank's result
(a course_lib collector), so that nothing here imports the launcher.
"""

from __future__ import annotations

import os
import pickle
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

# Frames in these folders are not the learner's: torch, the course's own code, the stdlib.
_NOT_OWN = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_PACKAGES = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)

_events: list[dict[str, Any]] = []
_PROBES = "course_lib.xray.probes."
_journal: dict[str, Any] = {"file": None}


def is_own(filename: str) -> bool:
    """True when a frame's file is the learner's code (not torch, course_lib or a library)."""
    if filename.startswith("<") or filename.startswith(_NOT_OWN) or filename.startswith(_STDLIB):
        return False
    return not any(p in filename for p in _PACKAGES)


def where(skip: int = 1) -> str:
    """The learner's "file:line" that led here: the innermost frame in the learner's code."""
    frame = sys._getframe(skip)
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
    """Append one event for this rank and return it (a probe may add to it later, e.g. a
    data loader pass its batches); `where_` overrides the learner's line found here."""
    event = {"kind": kind, "where": where(2) if where_ is None else where_,
             "t": time.monotonic(), **fields}
    _events.append(event)
    if _journal_file() is not None:
        _write_journal(event)
    return event


def journal(path: str) -> None:
    """Also append each event to `path` as it is noted: a rank that a signal kills (gloo's
    size check aborts it) sends nothing home, but its journal holds its events up to then
    (as they were noted: a data pass's batches come later and are not in it)."""
    _journal["file"] = open(path, "ab")  # noqa: SIM115 - open for the rank's life
    os.register_at_fork(after_in_child=_journal.clear)  # a DataLoader worker: not its file


def _journal_file() -> Any:
    return _journal.get("file")


def _write_journal(event: dict[str, Any]) -> None:
    try:
        pickle.dump(event, _journal["file"])
        _journal["file"].flush()  # in the kernel's hands: an abort cannot lose it
    except Exception:  # noqa: BLE001 - an unpicklable field, a full disk: stop journalling
        _journal["file"] = None


def journaled(path: str) -> list[dict[str, Any]] | None:
    """The events a rank journaled (None when it journaled none)."""
    events = []
    try:
        with open(path, "rb") as f:
            while True:
                events.append(pickle.load(f))
    except (EOFError, pickle.UnpicklingError):
        return events or None
    except OSError:
        return None


def events() -> list[dict[str, Any]]:
    """This rank's events so far, in order."""
    return _events


def clear() -> None:
    """Forget this rank's events (a fresh x-ray in the same process)."""
    _events.clear()


@contextmanager
def guard() -> Iterator[None]:
    """Around a probe's own bookkeeping: a failure there must never break the learner's
    run; it is kept as a "probe_error" event naming the probe module (the first one of
    each kind of error), and the rules that probe feeds say "could not check"."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - any bug of ours: note it, run on
        text = f"{type(exc).__name__}: {exc}"[:200]
        if not any(e["kind"] == "probe_error" and e["error"] == text for e in _events):
            _events.append({"kind": "probe_error", "where": "", "t": time.monotonic(),
                            "error": text, "probe": _probe_module()})


def _probe_module() -> str:
    """The probe whose bookkeeping failed: "ddp" for course_lib.xray.probes.ddp."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith(_PROBES):
            return name[len(_PROBES):]
        frame = frame.f_back
    return ""
