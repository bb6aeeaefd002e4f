"""Detector: ranks that issued different collectives (S1), and the rank-0-only evaluation
through the DDP wrapper that leaves rank 0 alone in DDP's buffer broadcast (X3), from the
failed run's desync report (launching/desync_report/): its fields, never its wording."""

from __future__ import annotations

import os

from course_lib import words
from course_lib.launching.desync_report import Call, DesyncReport, first_difference
from course_lib.launching.errors import is_collective_error
from course_lib.xray.events import Collective, DdpBufferSync
from course_lib.xray.report import Finding, finding
from course_lib.xray.rules import rule
from course_lib.xray.run_events import RunEvents

_DDP_FORWARD = ("DDP's forward", "DDP's buffer broadcast")


def _no_report(run: RunEvents) -> str:
    if run.error is None or run.desync is not None:
        return ""  # a run that ended normally had no hang and no desync to explain
    return "the run failed, but no desync report was made (flight recorder off)"


# S1 and X3 come from one reading of the desync report: each rule keeps its own id.
@rule("S1", needs=(Collective, DdpBufferSync), unjudged=_no_report,
      absent="no two ranks issued different collectives (the run neither hung nor aborted in "
             "one)")
def _s1(run: RunEvents) -> Finding | None:
    found = _desync(run)
    return found if found is not None and found.id == "S1" else None


@rule("X3", needs=(DdpBufferSync, Collective), unjudged=_no_report,
      absent="no rank ran an evaluation forward through the DDP wrapper while the others "
             "trained")
def _x3(run: RunEvents) -> Finding | None:
    found = _desync(run)
    return found if found is not None and found.id == "X3" else None


def _desync(run: RunEvents) -> Finding | None:
    """S1 or X3 when the ranks' collectives part; nothing when they agree."""
    report = run.desync
    if report is None or (report.first_difference is None and not report.mismatch):
        return None
    if _crashed(run):
        return None  # a rank's own error ended the run: its peers waited for it, no desync
    aborted = [r for r in report.mismatch if r in report.missing]
    if aborted or report.first_difference is None:
        return _mismatch(run, report, aborted or report.mismatch)
    seq = report.first_difference
    calls = {t.rank: t.at(seq) for t in report.traces if t.dumped}
    forward = [(r, c) for r, c in calls.items()
               if c is not None and c.part in _DDP_FORWARD]
    if forward:
        rank, call = forward[0]
        elsewhere = [r for r, c in calls.items() if r not in dict(forward) and (
            c is None or (c.op, c.where) != (call.op, call.where))]
        if elsewhere and _evaluating(run, rank):
            return finding("X3", report.summary, _where(run, call))
    stuck = [t for t in report.traces if t.dumped and not t.at(seq)
             and t.ended == "still running" and not t.inside]
    absent = [t for t in report.traces if t.dumped and not t.at(seq)]
    # A rank stuck outside any collective (a sleep, a file it waits for) is a hang, but not
    # proven to be a different path to a collective: its stack says more.
    certainty = "suspected" if absent and len(stuck) == len(absent) else "confirmed"
    return finding("S1", report.summary, _where(run, _branch(report)), certainty)


def _mismatch(run: RunEvents, report: DesyncReport, ranks: list[int]) -> Finding:
    """Gloo's size check aborted a rank, so its recorder is lost: its journaled events say
    whether it was evaluating through DDP while the others trained (X3), else S1."""
    evidence = _size_check(report)
    for rank in ranks:
        syncs = [e for r, e in run.of(DdpBufferSync) if r == rank]
        others = [e for r, e in run.of(DdpBufferSync) if r != rank]
        if syncs and others and not (syncs[-1]["grad"] and syncs[-1]["training"]) \
                and others[-1]["grad"] and others[-1]["training"]:
            how = "under no_grad" if not syncs[-1]["grad"] else "in eval mode"
            return finding("X3", f"rank {rank}'s last DDP forward ran {how} (an evaluation "
                                 f"through the DDP wrapper) while the other ranks' ran a "
                                 f"training step. {evidence}", _last_line(run, rank))
    return finding("S1", evidence + _last_calls(run), _last_line(run, ranks[0]))


def _size_check(report: DesyncReport) -> str:
    """'gloo's size check aborted rank 1: it received 64 bytes where its collective expected
    60, so the ranks called collectives of different kinds or sizes at the same point.'"""
    got = (f": it received {report.mismatch_bytes[0]} bytes where its collective expected "
           f"{report.mismatch_bytes[1]}" if report.mismatch_bytes else "")
    return (f"gloo's size check aborted {words.ranks(report.mismatch)}{got}, so the ranks called "
            "collectives of different kinds or sizes at the same point.")


def _last_calls(run: RunEvents) -> str:
    """' Each rank's last collective (the x-ray's records): rank 0 all_reduce [17, 1]; ...'"""
    last: dict[int, str] = {}
    for rank, e in run.of(Collective):
        last[rank] = f"rank {rank} {e['op']} {', '.join(map(str, e['shapes']))}".strip()
    return f" Each rank's last collective (the x-ray's records): {'; '.join(last.values())}." \
        if last else ""


def _last_line(run: RunEvents, rank: int) -> str:
    """The aborted rank's last collective's line, from its journaled events."""
    lines = [e["where"] for r, e in run.of(Collective) if r == rank and e["where"]]
    return lines[-1] if lines else ""


def _evaluating(run: RunEvents, rank: int) -> bool:
    """Whether the rank's last DDP buffer broadcast came from an evaluation forward (no_grad
    or eval mode); True when its events did not come back (the desync alone says X3), False
    when it made no buffer broadcast (a model without buffers: DDP's forward collective
    there is not the evaluation's)."""
    if rank not in run.ranks:
        return True
    syncs = [e for r, e in run.of(DdpBufferSync) if r == rank]
    return bool(syncs) and not (syncs[-1]["grad"] and syncs[-1]["training"])


def _branch(report: DesyncReport) -> Call | None:
    """Where the ranks' paths part: the first collective issued from a line that no other
    rank issued any collective from (else the first difference's first call)."""
    traces = [t for t in report.traces if t.dumped]
    diff = report.first_difference
    if diff is None:
        return None
    start = first_difference(traces, key=lambda c: (c.op, c.sizes, c.where))
    for seq in range(start or diff, diff + 1):
        for t in traces:
            call = t.at(seq)
            others = {c.where for o in traces if o is not t for c in o.calls}
            if call and call.where not in others:
                return call
    return next((c for c in (t.at(diff) for t in traces) if c is not None), None)


def _crashed(run: RunEvents) -> bool:
    """True when the run's root cause is a rank's own exception (not a peer's failure)."""
    failures = run.error.failures if run.error is not None else []
    mismatch = run.desync.mismatch if run.desync is not None else []
    return bool(failures) and failures[0].kind in ("exception", "exit", "signal") \
        and not failures[0].is_consequence and not is_collective_error(failures[0].message) \
        and failures[0].rank not in mismatch  # gloo's size check: a desync, not a crash


def _where(run: RunEvents, call: Call | None) -> str:
    """'trainer.py:40' from the call's line and its frame's file: the script's own, or a
    module of the script's folder (a multi-file script)."""
    if call is None or not call.function:
        return ""
    if not run.source:
        return f"{call.function}, line {call.line}"
    shown = run.source
    if call.file and os.path.isfile(call.file) \
            and os.path.realpath(call.file) != os.path.realpath(run.source):
        shown = os.path.relpath(call.file)
    return f"{shown}:{call.line}"
