"""Probe: what each rank prints, and from which line of the learner's code."""

from __future__ import annotations

import builtins
import io
import sys
from typing import Any

from course_lib.xray import record

_real_print = builtins.print
MAX_TEXT = 200  # characters of a printed line kept for the evidence


def install() -> None:
    """Record every print() the learner's code makes to stdout or stderr."""
    builtins.print = _print


def _print(*args: Any, **kwargs: Any) -> None:
    _real_print(*args, **kwargs)
    target = kwargs.get("file")
    if target not in (None, sys.stdout, sys.stderr):
        return  # into a file or a buffer: not the job's log
    caller = sys._getframe(1).f_code.co_filename
    if not record.is_own(caller):
        return  # torch's or the course's own message
    text = io.StringIO()
    _real_print(*args, **{**kwargs, "file": text, "flush": False})
    record.note("print", record.where(2), text=text.getvalue().rstrip("\n")[:MAX_TEXT])
