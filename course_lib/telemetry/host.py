"""The rank side's plug-in protocols: what a watcher needs from the recorder it writes
into, and what the transport needs from a recorder it sends home.

The watchers (comm, batchnorm, sampler) and the transport are plug-ins of Recorder: it
installs them and hands itself over. They name these protocols, not the Recorder or
Telemetry class, so that each depends only on what it uses and none imports its host (no
import circle, not even one hidden under TYPE_CHECKING). tests/test_telemetry.py checks
that Recorder satisfies them. (The kernel side's one protocol, what a Chrome trace is drawn
from, is chrome.TraceTables: that side stays free of torch.)
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from course_lib.telemetry.grads import Layout


@runtime_checkable
class RecordHost(Protocol):
    """Where a watcher writes: rows of the tables in columns.COLUMNS, and gradients."""

    current_step: int

    def record_row(self, table: str, *values: Any) -> None:
        """Append one row (in the table's column order, without rank) to a table."""

    def record_grads(self, step: int, when: str, bucket: int, flat: torch.Tensor,
                     layout: Layout) -> None:
        """Summarise a flat buffer of gradients laid out as `layout`."""

    def layout(self, params: list[torch.Tensor], names: dict[int, tuple[int, str]]) -> Layout:
        """The layout of these parameters' gradients concatenated in this order."""


@runtime_checkable
class Exporter(Protocol):
    """What the transport sends home: a recorder's tables as plain data."""

    def export(self) -> dict[str, Any]:
        """{"rank", "world_size", "tables": {table: {column: list}}}."""

