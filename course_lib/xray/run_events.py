"""RunEvents: what one x-rayed run did, every rank's events side by side, read by schema.

    run.of(Pass)       # [(rank, Pass), ...]: typed events, rank by rank in order
    run.only((Pass,))  # the same run, limited to these schemas: a rule's view of it

A rule is judged on `run.only(rule.needs)`, so reading a kind it did not declare raises
Undeclared: `needs` is what decides whether a failed probe leaves the rule unjudged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from course_lib.xray.events import KIND_OF, Event
from course_lib.xray.record import COLLECTOR

if TYPE_CHECKING:
    from course_lib.launching.desync_report import DesyncReport
    from course_lib.launching.errors import DistributedError
    from course_lib.launching.run import Run

E = TypeVar("E", bound=Event)


class Undeclared(KeyError):
    """A rule read an event kind that its `needs` does not name."""


@dataclass
class RunEvents:
    """One run as the rules see it.

    by_rank: per rank whose events came back, the probes' events in order (record.note);
    read them with `of`. error: the launch's DistributedError, or None when every rank
    returned. logs: per rank, everything it printed (stdout and stderr) as one text.
    """

    world_size: int
    by_rank: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    error: DistributedError | None = None
    logs: dict[int, str] = field(default_factory=dict)
    script: str = ""  # the x-rayed script or function, for the report's title
    source: str = ""  # the script's file (CLI), to name lines the flight recorder gives
    allowed: frozenset[type[Event]] | None = None  # a rule's view: the schemas it needs

    @property
    def desync(self) -> DesyncReport | None:
        """The failed launch's desync report (None when the run ended normally or none was
        made)."""
        return self.error.desync if self.error is not None else None

    @property
    def ranks(self) -> list[int]:
        """The ranks whose events came back, in order."""
        return sorted(self.by_rank)

    def of(self, schema: type[E]) -> list[tuple[int, E]]:
        """Every event of one kind, as (rank, event), rank by rank in order."""
        if self.allowed is not None and schema not in self.allowed:
            raise Undeclared(f"{schema.__name__} is not in this rule's needs")
        kind = KIND_OF[schema]
        return [(rank, cast(E, e)) for rank in self.ranks for e in self.by_rank[rank]
                if e["kind"] == kind]

    def only(self, needs: tuple[type[Event], ...]) -> RunEvents:
        """This run, limited to the schemas `needs` names."""
        return dataclasses.replace(self, allowed=frozenset(needs))

    def kinds(self) -> set[str]:
        """Every event kind this run noted, on any rank (the whole run's view only)."""
        if self.allowed is not None:
            raise Undeclared("a rule reads its events through of()")
        return {e["kind"] for events in self.by_rank.values() for e in events}

    @classmethod
    def from_run(cls, world_size: int, run: Run | None, error: DistributedError | None = None,
                 script: str = "", source: str = "") -> RunEvents:
        """Build from a launch's Run (or the failed launch's error.run) and its error. A
        rank killed by a signal left no snapshot: its extras hold the list of events it
        journaled, each event its own list item, which is what `by_rank` wants too."""
        events = cls(world_size=world_size, error=error, script=script, source=source)
        if run is None:
            return events
        for rank, extras in enumerate(run.extras):
            if COLLECTOR in extras:
                events.by_rank[rank] = list(extras[COLLECTOR])
        for rank in range(world_size):
            events.logs[rank] = run.output(rank)
        return events
