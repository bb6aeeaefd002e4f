"""A finished launch's outcome: the Run, or one DistributedError that says what every
failing rank did (root cause first, the ranks' collectives side by side).

The launcher (launcher.py) only supervises the ranks; this module reads what they left in
their Worker handles once they are all gone, so that building the report needs no pipes.
"""

from __future__ import annotations

import signal
from typing import Any

import cloudpickle

from course_lib.launching import desync_report, rank_record
from course_lib.launching.cells import name_cells
from course_lib.launching.errors import (
    DistributedError,
    RankFailure,
    annotate_stack,
    is_collective_error,
    root_cause_first,
)
from course_lib.launching.forkserver import Worker
from course_lib.launching.rank_main import LAUNCH_DIR, ErrorReport
from course_lib.launching.run import LogLine, Run
from course_lib.words import listing

OUTPUT_TAIL_LINES = 8


def outcome(workers: list[Worker], logs: list[LogLine], wall_time: float, timeout: float,
            timed_out: bool) -> Run:
    """The launch's Run; raise DistributedError (with that Run) if any rank failed.

    `workers` have all ended; `timeout` is the launch's, `timed_out` whether it ran out.
    """
    spec = workers[0].spec
    run = Run(world_size=spec.world_size, backend=spec.backend, logs=logs, wall_time=wall_time)
    failures = [f for f in (_failure(w, timeout) for w in workers) if f]
    for w in workers:
        value, sent = w.result or (None, w.error.get("extras") if w.error else None)
        returned, result = _result(w.rank, value, failed=bool(failures))
        run.results.append(result)
        run.returned += [w.rank] if returned else []
        run.extras.append(rank_record.read(w.rank, sent, w.spec.extras_path))
        run.timings.append(w.timings)
    if failures:
        raise DistributedError(_headline(workers, failures, timeout), failures, timed_out,
                               _desync(workers, failures), run=run)
    return run


def _failure(w: Worker, timeout: float) -> RankFailure | None:
    """What went wrong on one rank, or None if it returned."""
    tail = w.output[-OUTPUT_TAIL_LINES:]
    common: dict[str, Any] = dict(rank=w.rank, output_tail=tail, time=w.event_time)
    stack = name_cells(annotate_stack(w.stack, LAUNCH_DIR)) if w.stack else ""
    if w.error is not None:
        kind, summary = "exception", f"{w.error['type']}: {w.error['message']}"
        if w.error["type"] == "SystemExit":
            kind = "exit"
            summary = f"called sys.exit({w.error['message']}): exit code {w.exitcode}"
        return RankFailure(kind=kind, summary=summary, error_type=w.error["type"],
                           message=w.error["message"], traceback=_traceback_text(w.error),
                           **common)
    if w.stopped == "timeout":
        return RankFailure(kind="timeout", summary=f"still running at the {timeout:g} s "
                           "timeout", stack=stack, **common)
    if w.stopped:
        return RankFailure(kind="stopped", summary="still running after another rank "
                           "failed; stopped by the launcher", stack=stack, **common)
    if w.result is not None:
        return None  # it returned; a crash while tearing down is not the learner's bug
    return _exit_failure(w.exitcode, common)


def _desync(workers: list[Worker],
            failures: list[RankFailure]) -> desync_report.DesyncReport | None:
    """The ranks' flight-recorder dumps lined up (None when the recorder was off)."""
    if not workers[0].spec.flight_path:
        return None
    by_rank = {f.rank: f for f in failures}
    traces = []
    for w in workers:
        dump = desync_report.load(w.spec.flight_path)
        calls = desync_report.calls_from(dump) if dump else []
        failure = by_rank.get(w.rank)
        text = f"{failure.message}\n" + "\n".join(failure.output_tail) if failure else ""
        traces.append(desync_report.RankTrace(
            w.rank, calls, _ended(failure), _inside(failure, calls),
            collective_error=failure is not None and failure.kind == "exception"
            and is_collective_error(failure.message), dumped=dump is not None, text=text))
    return desync_report.build(traces, backend=workers[0].spec.backend)


def _headline(workers: list[Worker], failures: list[RankFailure], timeout: float) -> str:
    n = len(workers)
    hung = [f.rank for f in failures if f.kind == "timeout"]
    if hung:
        return (f"Timed out after {timeout:g} s with rank(s) {listing(sorted(hung))} still running "
                f"(world_size={n}). Each rank's Python stack (all threads) is shown below."
                f"{_returned_note(workers, failures)}")
    first = root_cause_first(failures)[0]
    return (f"{len(failures)} of {n} rank(s) failed. First failure: rank {first.rank}, "
            f"{first.summary}{_returned_note(workers, failures)}")


def _returned_note(workers: list[Worker], failures: list[RankFailure]) -> str:
    """Name the ranks that returned while others failed: a rank that leaves early makes
    its peers fail, and no error of theirs names it."""
    failed = {f.rank for f in failures}
    returned = [w.rank for w in workers if w.rank not in failed and w.result]
    if not returned:
        return ""
    return (f"\nRank(s) {listing(sorted(returned))} returned normally while the others had not "
            "finished: if a rank left early, its peers fail waiting for it.")


def _ended(failure: RankFailure | None) -> str:
    """How a rank ended, in a few words for the desync report."""
    if failure is None:
        return "returned"
    return {"exception": f"raised {failure.error_type}", "timeout": "still running",
            "stopped": "still running", "exit": "exited",
            "signal": f"killed by {failure.error_type}"}.get(failure.kind, failure.summary)


def _inside(failure: RankFailure | None, calls: list[desync_report.Call]) -> bool:
    """Whether the rank was blocked in its last collective when it ended: still running
    with that collective not completed, or failed with a collective's error."""
    if failure is None or not calls:
        return False
    if failure.kind in ("timeout", "stopped"):
        return not calls[-1].completed
    return failure.kind == "exception" and is_collective_error(failure.message)


def _exit_failure(exitcode: int | None, common: dict[str, Any]) -> RankFailure:
    """A rank that ended without a result or an error message: a signal or an exit code."""
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        why = {"SIGKILL": " (killed: out of memory, or someone sent kill -9)",
               "SIGABRT": " (aborted: a C++ error or os.abort())",
               "SIGSEGV": " (a segmentation fault in native code)"}.get(name, "")
        return RankFailure(kind="signal", summary=f"killed by signal {name}{why}",
                           error_type=name, message=f"killed by signal {name}", **common)
    return RankFailure(kind="exit", summary=f"exited with code {exitcode} without a result",
                       error_type="exit", message=f"exit code {exitcode}", **common)


def _result(rank: int, value: bytes | None, failed: bool) -> tuple[bool, Any]:
    """(whether the rank returned, its return value or None). In a failed launch a value
    that cannot be read back here is a warning, not a second error."""
    if not value:
        return False, None
    if not failed:
        return True, cloudpickle.loads(value)
    try:
        return True, cloudpickle.loads(value)
    except Exception as exc:  # noqa: BLE001 - the launch's error matters more: warn, go on
        rank_record.warn(f"rank {rank}'s return value could not be read back "
                         f"({type(exc).__name__}: {exc}); run.results[{rank}] is None.")
        return False, None


def _traceback_text(error: ErrorReport) -> str:
    """The rank's traceback with notebook cells named, or the best text it sent instead."""
    if error.get("traceback"):
        try:
            return name_cells("".join(cloudpickle.loads(error["traceback"]).format()))
        except Exception:  # noqa: BLE001 - the exception's class cannot load here
            pass
    return error.get("text") or f"{error['type']}: {error['message']}"
