"""The flight recorder's dump of one rank, read as the collectives it issued (`Call`s).

Each rank's dump (launching/flight.py) lists its collectives in order, with a sequence number
per process group that counts the same on every rank. What the rank did after its last
collective (returned, raised, still running) comes from the launcher, not the recorder.
"""

from __future__ import annotations

import linecache
import os
import pickle
from dataclasses import dataclass
from typing import Any

# One entry of torch's pickled flight-recorder dump (torch 2.13's format, read as data).
Entry = dict[str, Any]

_TORCH = os.sep + "torch" + os.sep
_LAUNCHER = os.sep + os.path.join("course_lib", "launching") + os.sep
_XRAY = os.sep + os.path.join("course_lib", "xray") + os.sep  # the x-ray's collective probe


@dataclass(frozen=True)
class Call:
    """One collective a rank issued: its number in its group (the launch's own barrier left
    out), op ("all_reduce"), input shapes, where it came from, and whether it completed."""

    seq: int
    op: str
    sizes: tuple[tuple[int, ...], ...]
    where: str  # in words: "train, line 40 (DDP's forward)"
    file: str  # the file of the frame `where` names ("" when it is inside torch)
    completed: bool
    function: str = ""  # the learner's innermost function ("" when the call is all torch's)
    line: int = 0  # that function's line
    part: str = ""  # what DDP or autograd was doing when the learner did not call it directly

    @property
    def label(self) -> str:
        """'all_reduce [3], [2, 4]': the op and its first shapes."""
        shapes = ", ".join(str(list(s)) for s in self.sizes[:3])
        more = ", ..." if len(self.sizes) > 3 else ""
        return f"{self.op} {shapes}{more}".strip()


@dataclass
class RankTrace:
    """One rank's collectives (default group) and how the rank ended."""

    rank: int
    calls: list[Call]
    ended: str  # "returned", "raised RuntimeError", "still running", ...
    inside: bool = False  # it was blocked in its last collective when it ended
    collective_error: bool = False  # it raised from a collective call, recorded or not
    dumped: bool = True  # False: no flight-recorder dump (killed by a signal)
    text: str = ""  # its error message and last output lines (where gloo prints an abort)

    def at(self, seq: int) -> Call | None:
        """The collective it issued at `seq`, None when it issued none there."""
        return next((c for c in self.calls if c.seq == seq), None)

    @property
    def last(self) -> int:
        """The sequence number of its last collective (0 before any)."""
        return self.calls[-1].seq if self.calls else 0


def load(path: str) -> dict[str, Any] | None:
    """A rank's dump, or None when it wrote none."""
    try:
        with open(path, "rb") as f:
            dump: dict[str, Any] = pickle.loads(f.read())
    except (OSError, pickle.UnpicklingError, EOFError):
        return None
    return dump


def calls_from(dump: dict[str, Any]) -> list[Call]:
    """The default group's collectives, numbered from the learner's first one."""
    entries = [e for e in dump.get("entries", [])
               if _group(e) == "default_pg" and not e.get("is_p2p")]
    offset = 1 if any(e["collective_seq_id"] == 1 and _is_launch_barrier(e)
                      for e in entries) else 0
    return [_call(e["collective_seq_id"] - offset, e) for e in entries
            if e["collective_seq_id"] - offset > 0]


def _call(seq: int, entry: Entry) -> Call:
    """One recorded collective, its origin as fields and in words."""
    frames = entry.get("frames", [])
    own = next((f for f in frames if _TORCH not in f["filename"]
                and _LAUNCHER not in f["filename"] and _XRAY not in f["filename"]), None)
    part = _part(frames[:frames.index(own)] if own else frames) or ""
    text = f"{own['name']}, line {own['line']}" if own else "inside torch"
    return Call(seq, entry["profiling_name"].split(":", 1)[-1],
                tuple(tuple(s) for s in entry.get("input_sizes", [])),
                f"{text} ({part})" if part else text, own["filename"] if own else "",
                completed=bool(entry.get("retired")), function=own["name"] if own else "",
                line=int(own["line"]) if own else 0, part=part)


def _group(entry: Entry) -> str:
    pg = entry.get("process_group") or ("", "")
    return str(pg[1]) if len(pg) > 1 else ""


def _is_launch_barrier(entry: Entry) -> bool:
    return any(_LAUNCHER in f["filename"] for f in entry.get("frames", []))


# What DDP is doing when one of its functions issues a collective (torch 2.13's names).
_DDP_PARTS = [("_sync_buffers", "DDP's buffer broadcast"), ("_pre_forward", "DDP's forward"),
              ("__init__", "DDP's constructor"), ("backward", "backward")]
# DDP's bucket rebuild is C++ (reducer._rebuild_buckets), called from one line of Python:
# its broadcasts show that line, whose source names it (torch 2.13: distributed.py:1775).
_REBUILD = "_rebuild_buckets"


def _part(inner: list[Entry]) -> str | None:
    """What DDP (or autograd) was doing, from the frames inside torch."""
    if any(_REBUILD in linecache.getline(f["filename"], f["line"]) for f in inner[:1]):
        return "DDP's bucket rebuild"
    names = {f["name"] for f in inner}
    return next((label for name, label in _DDP_PARTS if name in names), None)
