"""The rank side of the x-ray: install the probes, then run the learner's code."""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Callable
from typing import Any

from course_lib.collectors import register_collector
from course_lib.xray import record
from course_lib.xray.probes import install_all

COLLECTOR = "xray"  # the name the rank's events travel under (Run.extras[rank][COLLECTOR])


def observed(journal_dir: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run fn(*args, **kwargs) in this rank with every probe installed; the events go home
    with the rank's result, or its error, or (a rank the launcher stops) its last words; a
    rank killed by a signal leaves them in journal_dir (see journal_path)."""
    record.clear()
    register_collector(COLLECTOR, record.events)
    record.journal(journal_path(journal_dir, int(os.environ.get("RANK", "0"))))
    install_all()
    return fn(*args, **kwargs)


def journal_path(journal_dir: str, rank: int) -> str:
    """Where a rank journals its events."""
    return os.path.join(journal_dir, f"rank{rank}.events")


def run_script(path: str, argv: list[str], cwd: str = "") -> None:
    """Run a torchrun-style script as `python path argv...` would, in this rank, in `cwd`
    (the caller's folder: a reused worker may have started elsewhere)."""
    if cwd:
        os.chdir(cwd)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")
