"""Bring a process's records home: to the launcher (run.telemetry), or to per-rank files.

Under `launch`, the first Recorder of a worker registers a collector; the worker sends its
return value back with the rank's result. Under torchrun there is no launcher: with
COURSE_TELEMETRY_DIR set, each rank writes <dir>/rank<N>.json when it exits.
"""

from __future__ import annotations

import atexit
import json
import os
from pathlib import Path
from typing import Any

from course_lib.collectors import register_collector
from course_lib.telemetry.columns import COLUMNS
from course_lib.telemetry.host import Exporter

ENV_DIR = "COURSE_TELEMETRY_DIR"
# The name this process's records travel under: Run.extras[rank][COLLECTOR], read by
# Run.telemetry (course_lib/launching/run.py).
COLLECTOR = "telemetry"
_recorders: list[Exporter] = []


def track(rec: Exporter) -> None:
    """Include `rec` in what this process sends back (or writes at exit)."""
    if not _recorders:
        register_collector(COLLECTOR, process_records)
        if os.environ.get(ENV_DIR):
            atexit.register(_write_at_exit, os.environ[ENV_DIR])
    _recorders.append(rec)


def process_records() -> dict[str, Any]:
    """Every recorder of this process, merged into one export (see Recorder.export)."""
    parts = [r.export() for r in _recorders]
    tables = {name: {col: [v for p in parts for v in p["tables"][name][col]] for col in cols}
              for name, cols in COLUMNS.items()}
    return {"rank": parts[0]["rank"], "world_size": parts[0]["world_size"], "tables": tables}


def write(records: dict[str, Any], directory: str | os.PathLike) -> Path:
    """Write one rank's records to `directory`/rank<N>.json (atomically)."""
    path = Path(directory) / f"rank{records['rank']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(records))
    os.replace(partial, path)
    return path


def read(directory: str | os.PathLike) -> list[dict[str, Any]]:
    """Every rank's records written to `directory`."""
    paths = sorted(Path(directory).glob("rank*.json"))
    if not paths:
        raise FileNotFoundError(f"no rank*.json telemetry files in {directory}")
    return [json.loads(p.read_text()) for p in paths]


def _write_at_exit(directory: str) -> None:
    write(process_records(), directory)
