"""Chrome traces: export a run's spans and all-reduces, and read torch.profiler's traces.

The export opens in ui.perfetto.dev or chrome://tracing: one process track per rank, with a
"compute" thread (spans) and a "communication" thread (all-reduces). Traces that
torch.profiler exported on each rank become per-rank payloads (Recorder.export()'s shape),
which Telemetry.from_profiler_traces merges, so the same plots draw them. merge_traces writes
the per-rank profiler traces (and optionally the run's spans and all-reduces) into one file,
one process per rank, on the clock the ranks of a machine share. This module knows tables,
not the Telemetry class (TraceTables says what it reads): run_telemetry imports it, never
the other way round.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from course_lib.telemetry.columns import COLUMNS
from course_lib.telemetry.table import Table

COMPUTE, COMMUNICATION = 0, 1  # thread ids inside each rank's track
# record_function names that torch itself adds, and the span names they stand for
ALIASES = {"DistributedDataParallel.forward": "forward", "Optimizer.step": "optimizer",
           "Optimizer.zero_grad": "zero_grad"}
# chrome_trace's threads -> (thread id, name) in a merged trace
COURSE_THREADS = {COMPUTE: (1, "course: spans"), COMMUNICATION: (2, "course: all-reduce buckets")}
COLLECTIVE = re.compile(r"^(gloo|nccl|mpi|ucc):(\w+)$")  # e.g. "gloo:all_reduce"
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "int": 4,
               "long int": 8}


@runtime_checkable
class TraceTables(Protocol):
    """What a Chrome trace is drawn from (a Telemetry is one): ranks, spans, all-reduces."""

    ranks: list[int]
    spans: Table
    comms: Table


def chrome_trace(tel: TraceTables) -> dict[str, Any]:
    """The run as a Chrome trace (a dict ready for json.dump); times start at the run's start."""
    t0 = _start(tel)
    events = [e for rank in tel.ranks for e in _track_names(rank)]
    for rank, step, name, start, end in tel.spans.rows():
        events.append(_slice(rank, COMPUTE, name, start - t0, end - start, {"step": step}))
    for rank, step, op, bucket, nbytes, start, end in tel.comms.rows():
        label = f"{op} bucket {bucket}" if bucket >= 0 else op
        events.append(_slice(rank, COMMUNICATION, label, start - t0, end - start,
                             {"step": step, "bytes": nbytes}))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def save_chrome_trace(tel: TraceTables, path: str | os.PathLike) -> Path:
    """Write chrome_trace(tel) to `path` as JSON."""
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(tel)))
    return path


def merge_traces(paths: Iterable[str | os.PathLike], out: str | os.PathLike,
                 tel: TraceTables | None = None) -> Path:
    """Write torch.profiler's per-rank Chrome traces as ONE trace: process N is rank N.

    Every event moves to the rank's process (its threads keep their names: the Python
    thread, gloo's pt_gloo_runloop threads...), and every time to microseconds since the
    earliest event of any rank, on the shared clock (each trace's baseTimeNanoseconds plus
    its ts: Unix time). With `tel` (the same run's telemetry), its spans and all-reduces
    come too, as two threads per rank. A trace's rank comes from its distributedInfo.
    """
    traces = [json.loads(Path(p).read_text()) for p in paths]
    if not traces:
        raise ValueError("merge_traces() needs the per-rank trace files, got none")
    ranks = [(t.get("distributedInfo") or {}).get("rank", i) for i, t in enumerate(traces)]
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"two traces claim the same rank ({ranks}): pass one file per rank")
    base = min(t.get("baseTimeNanoseconds", 0) for t in traces)
    events = []
    for rank, trace in zip(ranks, traces):
        shift = (trace.get("baseTimeNanoseconds", 0) - base) / 1e3
        events += _rank_events(trace, rank, len(ranks), shift)
    if tel is not None:
        course = chrome_trace(tel)["traceEvents"]
        shift = _start(tel) * 1e6 - base / 1e3
        events += [_course_event(e, shift) for e in course if e["ph"] != "M" or
                   e["name"] == "thread_name"]
    t0 = min(e["ts"] for e in events if e["ph"] != "M")
    for e in events:
        e["ts"] = 0.0 if e["ph"] == "M" else e["ts"] - t0
    events.sort(key=lambda e: (e["ph"] != "M", e["pid"], e["tid"], e["ts"]))
    meta = [m for rank in ranks for m in _process_names(rank)]
    path = Path(out)
    path.write_text(json.dumps({"traceEvents": meta + events, "displayTimeUnit": "ms"}))
    return path


def _rank_events(trace: dict[str, Any], rank: int, world: int,
                 shift: float) -> list[dict[str, Any]]:
    """The events of one rank's own process, moved to pid `rank`; flow ids made unique."""
    kept = []
    for e in trace.get("traceEvents", []):
        if not isinstance(e.get("pid"), int) or e.get("ph") not in ("X", "M", "s", "f", "i"):
            continue  # the profiler's own pseudo-processes ("Spans", "Traces")
        if e["ph"] == "M" and e["name"] not in ("thread_name", "thread_sort_index"):
            continue  # process names come from _process_names
        e = {**e, "pid": rank, "ts": float(e.get("ts", 0)) + shift}
        if "id" in e:
            e["id"] = int(e["id"]) * world + rank
        kept.append(e)
    return kept


def _course_event(e: dict[str, Any], shift: float) -> dict[str, Any]:
    """A chrome_trace event on its own thread of the merged trace (OS thread ids are large)."""
    tid, name = COURSE_THREADS[e["tid"]]
    if e["ph"] == "M":
        return {**e, "tid": tid, "args": {"name": name}}
    return {**e, "tid": tid, "ts": e["ts"] + shift}


def _process_names(rank: int) -> list[dict[str, Any]]:
    return [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "ts": 0.0,
             "args": {"name": f"rank {rank}"}},
            {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "ts": 0.0,
             "args": {"sort_index": rank}}]


def profiler_payloads(paths: Iterable[str | os.PathLike]) -> list[dict[str, Any]]:
    """Per-rank traces from torch.profiler's export_chrome_trace, as per-rank payloads.

    record_function blocks become spans (ProfilerStep#N: span "step" of step N), collectives
    become comms rows (bytes need record_shapes=True, else 0). A trace's rank comes from
    its distributedInfo, else from its position in `paths`.
    """
    traces = [json.loads(Path(p).read_text()) for p in paths]
    return [_payload(t, i) for i, t in enumerate(traces)]


def _start(tel: TraceTables) -> float:
    starts = np.concatenate([tel.spans["start"], tel.comms["start"]]).astype(float)
    return float(starts.min()) if len(starts) else 0.0


def _track_names(rank: int) -> list[dict[str, Any]]:
    meta = [("process_name", COMPUTE, {"name": f"rank {rank}"}),
            ("process_sort_index", COMPUTE, {"sort_index": rank}),
            ("thread_name", COMPUTE, {"name": "compute"}),
            ("thread_name", COMMUNICATION, {"name": "communication"})]
    return [{"ph": "M", "name": n, "pid": rank, "tid": tid, "args": a} for n, tid, a in meta]


def _slice(rank: int, tid: int, name: str, start: float, duration: float,
           args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "name": name, "pid": rank, "tid": tid, "ts": start * 1e6,
            "dur": duration * 1e6, "args": args}


def _payload(trace: dict[str, Any], position: int) -> dict[str, Any]:
    info = trace.get("distributedInfo") or {}
    base = trace.get("baseTimeNanoseconds", 0) / 1e9
    events = [e for e in trace.get("traceEvents", [])
              if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    times = [(base + e["ts"] / 1e6, base + (e["ts"] + e["dur"]) / 1e6) for e in events]
    steps = [(s, e, int(ev["name"].split("#")[1])) for ev, (s, e) in zip(events, times)
             if ev["name"].startswith("ProfilerStep#")]
    spans, comms = [], []
    for event, (start, end) in zip(events, times):
        step = next((n for s, e, n in steps if s <= start <= e), 0)
        collective = COLLECTIVE.match(event["name"])
        if collective:
            op = collective.group(2).replace("_", "")
            comms.append((step, op, -1, _bytes(event.get("args", {})), start, end))
        else:
            spans.append((step, _span_name(event["name"]), start, end))
    tables = {name: {c: [] for c in cols} for name, cols in COLUMNS.items()}
    tables["spans"] = dict(zip(COLUMNS["spans"], map(list, zip(*spans)))) or tables["spans"]
    tables["comms"] = dict(zip(COLUMNS["comms"], map(list, zip(*comms)))) or tables["comms"]
    return {"rank": info.get("rank", position), "world_size": info.get("world_size", 1),
            "tables": tables}


def _span_name(name: str) -> str:
    if name.startswith("ProfilerStep#"):
        return "step"
    return next((alias for prefix, alias in ALIASES.items() if name.startswith(prefix)), name)


def _bytes(args: dict[str, Any]) -> int:
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    return sum(int(np.prod(d)) * DTYPE_BYTES.get(t, 0) for d, t in zip(dims, types))
