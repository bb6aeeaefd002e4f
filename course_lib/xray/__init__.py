"""X-ray: run a learner's own DDP training code and tell which of the course's pitfalls it
has, with evidence from the run, where in the code the fix goes, and the lesson to read.

    from course_lib.xray import xray
    report = xray(train, world_size=2)            # a notebook function (as for launch)
    python -m course_lib xray --nproc-per-node 2 train.py [args]   # a torchrun-style script
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from course_lib.xray.report import Finding, Report, finding

__all__ = ["xray", "Report", "Finding", "finding"]

NOT_TRAINED = "the script did not train here (the first line says why)"
FAILED = "the run failed before it finished, so an absence proves nothing"


def xray(train_fn: Callable[..., Any], world_size: int = 2, *, timeout: float = 60.0,
         title: str = "", source: str = "", **launch_kwargs: Any) -> Report:
    """Run train_fn on `world_size` ranks (course_lib.launch, same arguments) with the
    x-ray's probes installed, and return its Report. `report.run` holds the Run (or the
    failed launch's partial Run), `report.failure` the DistributedError or None."""
    from course_lib.launching import DistributedError, launch
    from course_lib.launching.cells import cell_name, name_cell_paths
    from course_lib.launching.launcher import PG_TIMEOUT_MAX_S
    from course_lib.xray.cause import cause, trained
    from course_lib.xray.detectors import run_all
    from course_lib.xray.on_rank import observed
    from course_lib.xray.run_events import RunEvents
    from course_lib.xray.tidy import tidy

    # A hang ends this soon after its collective began: a quarter of the run's timeout, at
    # most launch's ceiling, at least 1 s; a collective that waits longer for a slow peer fails.
    launch_kwargs.setdefault("pg_timeout", max(1.0, min(PG_TIMEOUT_MAX_S, timeout / 4)))
    title = title or f"X-ray of {getattr(train_fn, '__name__', 'the function')} on " \
                     f"{world_size} ranks"
    error, launched = None, None
    try:
        launched = launch(functools.partial(observed, train_fn), world_size, timeout=timeout,
                          **launch_kwargs)
    except DistributedError as exc:
        error, launched = exc, exc.run
    run = RunEvents.from_run(world_size, launched, error, script=title, source=source)
    why = name_cell_paths(cause(run))
    report = run_all(run, error_text=tidy(str(error)) if error else "", title=title,
                     judge_nothing=NOT_TRAINED if why and not trained(run) else "",
                     absence_proves_nothing=FAILED if why or error else "")
    report.run, report.failure, report.cause = launched, error, why
    report.findings = [dataclasses.replace(f, where=cell_name(f.where),
                                           evidence=name_cell_paths(f.evidence))
                       for f in report.findings]
    return report
