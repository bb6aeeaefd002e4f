"""RunEvents: what one x-rayed run did, every rank's events side by side."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from course_lib.xray.on_rank import COLLECTOR


@dataclass
class RunEvents:
    """One run as the detectors see it.

    events: per rank, the probes' events in order (see record.note).
    error: the launch's DistributedError, or None when every rank returned.
    desync: the error's desync report (launching.desync_report.DesyncReport) or None.
    logs: per rank, everything it printed (stdout and stderr) as one text.
    """

    world_size: int
    events: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    error: Any = None
    desync: Any = None
    logs: dict[int, str] = field(default_factory=dict)
    script: str = ""  # the x-rayed script or function, for the report's title
    source: str = ""  # the script's file (CLI), to name lines the flight recorder gives

    def of(self, kind: str) -> list[tuple[int, dict[str, Any]]]:
        """Every event of one kind, as (rank, event), rank by rank in order."""
        return [(rank, e) for rank in sorted(self.events) for e in self.events[rank]
                if e["kind"] == kind]

    @classmethod
    def from_run(cls, world_size: int, run: Any, error: Any = None,
                 script: str = "", source: str = "") -> RunEvents:
        """Build from a launch's Run (or the failed launch's error.run) and its error."""
        obs = cls(world_size=world_size, error=error,
                  desync=getattr(error, "desync", None), script=script,
                  source=source)
        if run is None:
            return obs
        for rank, extras in enumerate(run.extras):
            if COLLECTOR in extras:
                obs.events[rank] = extras[COLLECTOR]
        for rank in range(world_size):
            obs.logs[rank] = run.output(rank)
        return obs
