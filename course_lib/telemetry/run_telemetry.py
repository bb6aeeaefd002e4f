"""Telemetry: every rank's records from one run, merged into tables with a `rank` column."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from course_lib.telemetry import chrome
from course_lib.telemetry.columns import COLUMNS
from course_lib.telemetry.table import Table
from course_lib.telemetry.transport import read


class Telemetry:
    """One run's records from every rank. Each attribute is a Table whose first column is rank:

    scalars (step, name, value); spans (step, name, start, end: seconds on the shared clock);
    grads (step, when, bucket, param, index, norm, values); comms (step, op, bucket, bytes,
    start, end); batchnorm (step, layer, batch_mean, batch_var, running_mean, running_var);
    samples (epoch, position, index).
    """

    def __init__(self, tables: dict[str, Table], ranks: list[int], world_size: int) -> None:
        self.scalars: Table = tables["scalars"]
        self.spans: Table = tables["spans"]
        self.grads: Table = tables["grads"]
        self.comms: Table = tables["comms"]
        self.batchnorm: Table = tables["batchnorm"]
        self.samples: Table = tables["samples"]
        self.ranks, self.world_size = ranks, world_size

    @classmethod
    def from_payloads(cls, payloads: Iterable[dict[str, Any] | None]) -> Telemetry:
        """Merge per-rank exports (Recorder.export()); None stands for a rank without records."""
        parts = [p for p in payloads if p]
        tables = {name: Table.concat([_table(p, name) for p in parts] or [_empty(name)])
                  for name in COLUMNS}
        ranks = sorted({p["rank"] for p in parts})
        return cls(tables, ranks, max((p["world_size"] for p in parts), default=0))

    @classmethod
    def from_profiler_traces(cls, paths: Iterable[str | os.PathLike]) -> Telemetry:
        """The Telemetry of per-rank traces from torch.profiler's export_chrome_trace (see
        chrome.profiler_payloads for what becomes spans and comms)."""
        return cls.from_payloads(chrome.profiler_payloads(paths))

    def to_chrome_trace(self, path: str | os.PathLike) -> Path:
        """Write spans and all-reduces as a Chrome trace (open it in ui.perfetto.dev)."""
        return chrome.save_chrome_trace(self, path)

    def __repr__(self) -> str:
        counts = ", ".join(f"{len(getattr(self, name))} {name}" for name in COLUMNS)
        return f"Telemetry(ranks {self.ranks}: {counts})"


def load(directory: str | os.PathLike) -> Telemetry:
    """The Telemetry of a torchrun job whose ranks wrote files to `directory`."""
    return Telemetry.from_payloads(read(directory))


def _table(payload: dict[str, Any], name: str) -> Table:
    columns = payload["tables"][name]
    rows = len(columns[COLUMNS[name][0]])
    return Table({"rank": [payload["rank"]] * rows, **columns})


def _empty(name: str) -> Table:
    return Table({col: [] for col in ("rank", *COLUMNS[name])})
