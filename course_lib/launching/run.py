"""Run: what a launch brings back from its ranks."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from course_lib.telemetry import Telemetry


@dataclass
class LogLine:
    """One line a rank printed: `stream` is "stdout" or "stderr"; `time` is time.time()."""

    rank: int
    stream: str
    time: float
    text: str


@dataclass
class Run:
    """The outcome of one launch.

    results: each rank's return value, in rank order; None for a rank that did not return
    (in a failed launch's Run, DistributedError.run).
    returned: the ranks that returned, whose values `results` holds.
    logs: every line every rank printed, in arrival order.
    timings: per rank, time.time() stamps "started" (process up), "ready" (process group
    initialised: before the launch began for ranks started ahead, launching/standby.py),
    and "result" (its return value received; "error" instead when it raised).
    extras: per rank, data sent back by collectors such as course_lib.telemetry.
    """

    world_size: int
    backend: str
    results: list[Any] = field(default_factory=list)
    returned: list[int] = field(default_factory=list)
    logs: list[LogLine] = field(default_factory=list)
    timings: list[dict[str, float]] = field(default_factory=list)
    extras: list[dict[str, Any]] = field(default_factory=list)
    wall_time: float = 0.0

    def output(self, rank: int | None = None) -> str:
        """Everything printed (stdout and stderr), by one rank or by all with prefixes."""
        if rank is not None:
            return "".join(line.text + "\n" for line in self.logs if line.rank == rank)
        return "".join(f"[rank {line.rank}] {line.text}\n" for line in self.logs)

    @cached_property
    def telemetry(self) -> Telemetry:
        """Every rank's course_lib.telemetry records, merged (built on first use)."""
        from course_lib.telemetry import COLLECTOR, Telemetry

        return Telemetry.from_payloads(extras.get(COLLECTOR) for extras in self.extras)

    def __repr__(self) -> str:
        return (
            f"Run(world_size={self.world_size}, backend={self.backend!r}, "
            f"wall_time={self.wall_time:.2f}s, results={self.results!r})"
        )
