"""What both lesson 10 checks say about a hang: where the ranks parted, from the failed
launch's desync report, and its time-limit line."""

from __future__ import annotations

from typing import Any


def where_parted(report: Any) -> str | None:
    """'the ranks parted at collective #k: rank 0 in all_reduce (...); rank 1 ...', or None
    when the report found no first difference."""
    if report is None or report.first_difference is None:
        return None
    k = report.first_difference
    doing = []
    for trace in report.traces:
        call = trace.at(k)
        what = (f"in {call.op} ({call.where})" if call
                else f"{trace.ended} after {trace.last} collectives")
        doing.append(f"rank {trace.rank} {what}")
    return f"the ranks parted at collective #{k}: {'; '.join(doing)}."


def time_limit_note(failure: Any) -> str:
    """The details' time-limit line, without its 'root cause' line: in a hang every rank
    times out, and the one the launcher lists first is a victim like the others."""
    lines = failure.details().splitlines()[1:]
    return "\n" + "\n".join(lines) if lines else ""
