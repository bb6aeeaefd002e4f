"""Probe: what each rank prints (print() and the logging module's console handlers), and
from which line of the learner's code."""

from __future__ import annotations

import builtins
import functools
import io
import logging
import sys
from typing import Any

from course_lib.xray import record
from course_lib.xray.probes.patching import Patch, apply

_real_print = builtins.print
MAX_TEXT = 200  # characters of a printed line kept for the evidence


def patches() -> list[Patch]:
    """print() and the logging module's stream handlers."""
    return [Patch(builtins, "print", lambda real: _print),
            Patch(logging.StreamHandler, "emit", _emit)]


def install() -> None:
    """Record every print() and log record the learner's code writes to stdout or stderr."""
    apply(patches())


def _emit(real: Any) -> Any:
    @functools.wraps(real)
    def emit(self: logging.StreamHandler[Any], rec: logging.LogRecord) -> None:
        real(self, rec)
        with record.guard():
            if self.stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) \
                    and record.is_own(rec.pathname):
                record.note("print", record.location(rec.pathname, rec.lineno),
                            text=rec.getMessage()[:MAX_TEXT])
    return emit


def _print(*args: Any, **kwargs: Any) -> None:
    _real_print(*args, **kwargs)
    target = kwargs.get("file")
    if target not in (None, sys.stdout, sys.stderr):
        return  # into a file or a buffer: not the job's log
    caller = sys._getframe(1).f_code.co_filename
    if not record.is_own(caller):
        return  # torch's or the course's own message
    with record.guard():
        text = io.StringIO()
        _real_print(*args, **{**kwargs, "file": text, "flush": False})
        record.note("print", record.where(2), text=text.getvalue().rstrip("\n")[:MAX_TEXT])
