"""The rank side of the x-ray: install the probes, then run the learner's code."""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Callable
from typing import Any

from course_lib.collectors import register_collector
from course_lib.xray import record
from course_lib.xray.probes import install_all, process


def observed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run fn(*args, **kwargs) in this rank with every probe installed. The events go home
    with the rank's result, or its error, or (a rank the launcher stops) its last words,
    and each is journaled as noted (a rank killed by a signal): record.COLLECTOR."""
    record.clear()
    register_collector(record.COLLECTOR, record.events)
    install_all()
    try:
        return fn(*args, **kwargs)
    except SystemExit as exc:  # sys.exit(), exit(), argparse: where and why it stopped
        process.exited(exc)
        raise


def run_script(path: str, argv: list[str], cwd: str = "") -> None:
    """Run a torchrun-style script as `python path argv...` would, in this rank, in `cwd`
    (the caller's folder: a reused worker may have started elsewhere)."""
    if cwd:
        os.chdir(cwd)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")
