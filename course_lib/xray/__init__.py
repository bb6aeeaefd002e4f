"""X-ray: run a learner's own DDP training code and tell which of the course's pitfalls it
has, with evidence from the run, where in the code, and the lesson to read.

    report = xray(train, world_size=2)            # a notebook function (as for launch)
    python -m course_lib xray --nproc-per-node 2 train.py [args]   # a torchrun-style script
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import tempfile
import types
from collections.abc import Callable
from typing import Any

from course_lib.xray.report import Finding, Report, finding

__all__ = ["xray", "Report", "Finding", "finding"]


def xray(train_fn: Callable[..., Any], world_size: int = 2, *, timeout: float = 60.0,
         title: str = "", source: str = "", **launch_kwargs: Any) -> Report:
    """Run train_fn on `world_size` ranks (course_lib.launch, same arguments) with the
    x-ray's probes installed, and return its Report. `report.run` holds the Run (or the
    failed launch's partial Run), `report.failure` the DistributedError or None."""
    from course_lib.launching import DistributedError, launch
    from course_lib.launching.cells import cell_name, name_cell_paths
    from course_lib.launching.launcher import PG_TIMEOUT_MAX_S
    from course_lib.xray.cause import cause
    from course_lib.xray.detectors import run_all
    from course_lib.xray.on_rank import journal_path, observed
    from course_lib.xray.record import journaled
    from course_lib.xray.run_events import RunEvents
    from course_lib.xray.tidy import tidy

    # A hang ends this soon after its collective began: a quarter of the run's timeout, at
    # most launch's ceiling, at least 1 s; a collective that waits longer for a slow peer fails.
    launch_kwargs.setdefault("pg_timeout", max(1.0, min(PG_TIMEOUT_MAX_S, timeout / 4)))
    title = title or f"X-ray of {getattr(train_fn, '__name__', 'the function')} on " \
                     f"{world_size} ranks"
    error, run = None, None
    with tempfile.TemporaryDirectory(prefix="course_lib-xray-") as journal_dir:
        try:
            run = launch(functools.partial(observed, journal_dir, train_fn), world_size,
                         timeout=timeout, **launch_kwargs)
        except DistributedError as exc:
            error, run = exc, exc.run
        obs = RunEvents.from_run(world_size, run, error, script=title, source=source)
        for rank in set(range(world_size)) - set(obs.events):  # killed by a signal
            events = journaled(journal_path(journal_dir, rank))
            if events is not None:
                obs.events[rank] = events
    report = run_all(obs, error_text=tidy(str(error)) if error else "", title=title)
    report.run, report.failure, report.cause = run, error, cause(obs)
    if error is not None or report.cause:
        report.checked = []  # a run that died or never trained proves no absence
    report.findings = [dataclasses.replace(f, where=cell_name(f.where),
                                           evidence=name_cell_paths(f.evidence))
                       for f in report.findings]
    return report


class _CallablePackage(types.ModuleType):
    """`from course_lib import xray` gives this package instead of the function once any
    course_lib.xray module was imported (Python sets the submodule as the attribute): so
    the package calls the function."""

    def __call__(self, *args: Any, **kwargs: Any) -> Report:
        return xray(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
