"""The desync report: which collectives each rank issued, side by side, and where they part.

Three jobs, one module each: `trace` reads a rank's flight-recorder dump as `Call`s,
`compare` lines the ranks up into fields (the first difference, gloo's size check, a rank's
own exception...), `render` writes the sentences and the table. A reader of the report (the
x-ray) branches on the fields, never on the wording.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.launching.desync_report.compare import Comparison, compare, first_difference
from course_lib.launching.desync_report.render import comparison, lead, summary, table
from course_lib.launching.desync_report.trace import Call, RankTrace, calls_from, load

__all__ = ["Call", "Comparison", "DesyncReport", "RankTrace", "build", "calls_from",
           "comparison", "first_difference", "lead", "load"]


@dataclass
class DesyncReport(Comparison):
    """The comparison's fields (compare.Comparison) with its summary in words."""

    summary: str = ""

    def table(self) -> str:
        """The side-by-side text table, the first difference marked with >>."""
        return table(self, self.summary)

    def __str__(self) -> str:
        return self.table()


def build(traces: list[RankTrace], backend: str = "gloo") -> DesyncReport:
    """Line up the ranks' collectives, find where they first differ, and say it."""
    found = compare(traces, backend)
    return DesyncReport(**vars(found), summary=summary(found))
