"""The desync report: which collectives each rank issued, side by side, and where they part.

Each rank's flight-recorder dump (launching/flight.py) lists its collectives in order, with
a sequence number per process group that counts the same on every rank. Lined up by that
number, the ranks' lists must agree; the first number where a rank issued nothing, another
collective, or another shape is where the job went wrong. What each rank did after its last
collective (returned, raised, still running) comes from the launcher, not the recorder.
"""

from __future__ import annotations

import os
import pickle
from collections import Counter
from dataclasses import dataclass, field

from course_lib.launching.errors import GLOO_MISMATCH, leading_notes, raised_outside

ROWS = 6  # collectives shown before the first difference, at most
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
    where: str
    file: str  # the file of the frame `where` names ("" when it is inside torch)
    completed: bool

    @property
    def label(self) -> str:
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
    dumped: bool = True  # False: no flight-recorder dump (killed by a signal)
    text: str = ""  # its error message and last output lines (where gloo prints an abort)

    def at(self, seq: int) -> Call | None:
        return next((c for c in self.calls if c.seq == seq), None)

    @property
    def last(self) -> int:
        return self.calls[-1].seq if self.calls else 0


@dataclass
class DesyncReport:
    """The ranks' collectives lined up; `first_difference` is the first sequence number
    where they differ (None when they agree), `summary` says it in one sentence."""

    traces: list[RankTrace]
    first_difference: int | None
    summary: str
    missing: list[int] = field(default_factory=list)  # ranks with no dump
    mismatch: list[int] = field(default_factory=list)  # ranks where gloo saw a size mismatch

    def table(self) -> str:
        """The side-by-side text table, the first difference marked with >>."""
        return render(self)

    def __str__(self) -> str:
        return self.table()


# -- reading the dumps ---------------------------------------------------------------------

def load(path: str) -> dict | None:
    """A rank's dump, or None when it wrote none."""
    try:
        with open(path, "rb") as f:
            return pickle.loads(f.read())
    except (OSError, pickle.UnpicklingError, EOFError):
        return None


def calls_from(dump: dict) -> list[Call]:
    """The default group's collectives, numbered from the learner's first one."""
    entries = [e for e in dump.get("entries", [])
               if _group(e) == "default_pg" and not e.get("is_p2p")]
    offset = 1 if any(e["collective_seq_id"] == 1 and _is_launch_barrier(e)
                      for e in entries) else 0
    return [Call(e["collective_seq_id"] - offset, e["profiling_name"].split(":", 1)[-1],
                 tuple(tuple(s) for s in e.get("input_sizes", [])),
                 *_where(e.get("frames", [])), completed=bool(e.get("retired")))
            for e in entries if e["collective_seq_id"] - offset > 0]


def _group(entry: dict) -> str:
    pg = entry.get("process_group") or ("", "")
    return pg[1] if len(pg) > 1 else ""


def _is_launch_barrier(entry: dict) -> bool:
    return any(_LAUNCHER in f["filename"] for f in entry.get("frames", []))


# What DDP is doing when one of its functions issues a collective (torch 2.13's names).
_DDP_PARTS = [("_sync_buffers", "DDP's buffer broadcast"),
              ("_rebuild_buckets", "DDP's bucket rebuild"), ("_pre_forward", "DDP's forward"),
              ("__init__", "DDP's constructor"), ("backward", "backward")]


def _where(frames: list[dict]) -> tuple[str, str]:
    """Where a collective came from: the learner's innermost frame, and what DDP (or
    autograd) was doing when the learner did not call it directly; and that frame's file."""
    own = next((f for f in frames if _TORCH not in f["filename"]
                and _LAUNCHER not in f["filename"] and _XRAY not in f["filename"]), None)
    names = {f["name"] for f in (frames[:frames.index(own)] if own else frames)}
    text = f"{own['name']}, line {own['line']}" if own else "inside torch"
    part = next((label for name, label in _DDP_PARTS if name in names), None)
    return (f"{text} ({part})" if part else text), (own["filename"] if own else "")


# -- lining them up --------------------------------------------------------------------------

def build(traces: list[RankTrace], backend: str = "gloo") -> DesyncReport:
    """Line up the ranks' collectives and find where they first differ. The summary leads
    with what outranks the comparison: NCCL (not covered), a rank's own exception, gloo's
    mismatch check; a rank without a dump is never counted as agreeing."""
    diff = first_difference(traces)
    missing = [t.rank for t in traces if not t.dumped]
    mismatch = [t.rank for t in traces if GLOO_MISMATCH.search(t.text)]
    first = leading_notes(traces, mismatch, backend)
    parts = [*first, _summary(traces, diff, missing, bool(mismatch) or backend == "nccl"),
             "" if raised_outside(traces) else _site_counts(traces)]
    return DesyncReport(traces, diff, " ".join(p for p in parts if p), missing, mismatch)


def _site_counts(traces: list[RankTrace]) -> str:
    """Collectives counted per call site, where the ranks' counts differ: a skipped DDP
    backward pairs its bucket all-reduces with the next step's, and shows only here."""
    dumped = [t for t in traces if t.dumped]
    counts = {t.rank: Counter(c.where for c in t.calls) for t in dumped}
    sites = list(dict.fromkeys(c.where for t in dumped for c in t.calls))
    differ = [w for w in sites if len({counts[r][w] for r in counts}) > 1][:2]
    if len(dumped) < 2 or not differ:
        return ""
    said = "; ".join(f"from {w}: " + ", ".join(f"rank {r} issued {counts[r][w]}"
                                              for r in sorted(counts)) for w in differ)
    return f"Counted per call site, the ranks differ: {said}."


def first_difference(traces: list[RankTrace], key=lambda c: (c.op, c.sizes)) -> int | None:
    """The first sequence number where a rank issued nothing or something else (by `key`)."""
    traces = [t for t in traces if t.dumped]
    if not traces:
        return None
    start = max((t.calls[0].seq for t in traces if t.calls), default=1)
    end = max(t.last for t in traces)
    for seq in range(start, end + 1):
        calls = [t.at(seq) for t in traces]
        if None in calls or len({key(c) for c in calls}) > 1:
            return seq
    return None


def _issued(dumped: list[RankTrace], n: int) -> str:
    """What the ranks that left a dump issued (one rank: no 'the same')."""
    if len(dumped) == 1:
        return f"Rank {dumped[0].rank} issued {dumped[0].last} collective(s)."
    return (f"Ranks {_ranks([t.rank for t in dumped])} issued the same {n} collective(s) "
            "in the same order.")


def _summary(traces: list[RankTrace], diff: int | None, missing: list[int],
             unsure: bool = False) -> str:
    """The comparison in one or two sentences. "No desync" only when every rank left a
    dump and nothing else (gloo's mismatch check, NCCL) says otherwise."""
    gap = (f" Rank(s) {_ranks(missing)} left no flight-recorder dump (a rank killed by a "
           "signal takes its recorder with it): see its output and stack.") if missing else ""
    dumped = [t for t in traces if t.dumped]
    if diff is None:
        n = max((t.last for t in dumped), default=0)
        if not n:
            return ("The flight recorder holds no collective of the default group from any "
                    "rank (monitored_barrier's messages and the group that "
                    "TORCH_DISTRIBUTED_DEBUG=DETAIL wraps are not counted): see the errors "
                    f"and stacks below.{gap}")
        if missing:
            return (f"Rank(s) {_ranks(missing)} left no flight-recorder dump (a rank killed "
                    "by a signal takes its recorder with it), so what they issued is unknown: "
                    f"this is not shown to be free of a desync. {_issued(dumped, n)}")
        if unsure:
            return f"The recorded collectives agree (each rank issued the same {n})."
        raised = all(t.ended.startswith("raised") for t in dumped)
        stuck = "" if raised else "; a rank stuck outside any collective shows in its stack"
        return (f"The ranks' collectives agree (each issued the same {n} in the same order), "
                f"so this is no desync{stuck}.{gap}")
    present = [t for t in dumped if t.at(diff)]
    absent = [t for t in dumped if not t.at(diff)]
    text = f"First difference at collective #{diff}: "
    if absent:
        said = "; ".join(_absent_text(t) for t in absent)
        text += f"{said}, while {_calls_text(present, diff)}."
    else:
        text += f"{_calls_text(dumped, diff)}."
    return text + _site_note(dumped, diff) + gap


def _site_note(traces: list[RankTrace], diff: int) -> str:
    """An earlier collective that matched in kind and shape but came from different lines:
    a skipped collective pairs silently with the next one of the same shape."""
    site = first_difference(traces, key=lambda c: (c.op, c.sizes, c.where))
    if site is None or site >= diff:
        return ""
    froms = "; ".join(f"rank {t.rank} from {t.at(site).where}" for t in traces)
    return (f" Earlier, collective #{site} matched in kind and shape but came from different "
            f"lines ({froms}): a skipped collective pairs silently with the next one.")


def _absent_text(trace: RankTrace) -> str:
    after = f"after its {_nth(trace.last)} collective" if trace.last else "before any collective"
    if trace.ended == "returned":
        return f"rank {trace.rank} returned {after}"
    if trace.ended.startswith("raised"):
        return f"rank {trace.rank} {trace.ended} {after}"
    where = "inside it" if trace.inside else "outside any collective (see its stack)"
    return f"rank {trace.rank} never issued it: {trace.ended} {after}, {where}"


def _calls_text(traces: list[RankTrace], seq: int) -> str:
    """'ranks 0, 2 were in their 3rd (all_reduce [3], from f, line 12)', grouped by call."""
    groups: dict[tuple, list[RankTrace]] = {}
    for t in traces:
        call = t.at(seq)
        groups.setdefault((call.label, call.where), []).append(t)
    parts = []
    for (label, where), ts in groups.items():
        ranks = [t.rank for t in ts]
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranks(ranks)}"
        verb = "was" if len(ranks) == 1 else "were"
        inside = all(t.inside for t in ts)
        state = f"{verb} in" if inside else "issued"
        parts.append(f"{who} {state} {'its' if len(ranks) == 1 else 'their'} {_nth(seq)} "
                     f"({label}, from {where})")
    return "; ".join(parts)


# -- the text table --------------------------------------------------------------------------

def render(report: DesyncReport) -> str:
    traces = report.traces
    end = max((t.last for t in traces), default=0)
    diff = report.first_difference
    first = max(1, (diff if diff is not None else end) - ROWS + 1)
    first = max(first, max((t.calls[0].seq for t in traces if t.calls), default=1))
    width = max(18, *(len(c.label) + 3 for t in traces for c in t.calls if c.seq >= first),
                *(len(t.ended) for t in traces))
    head = "      # | " + " | ".join(f"rank {t.rank}".ljust(width) for t in traces)
    lines = ["Desync report: each rank's collectives, in order (PyTorch's flight recorder, "
             "default group; the launch's own barrier not counted)", head,
             "-" * len(head)]
    for seq in range(first, end + 1):
        mark = ">>" if seq == diff else "  "
        cells = [_cell(t, seq).ljust(width) for t in traces]
        lines.append(f"{mark} {seq:>4} | " + " | ".join(cells))
    lines.append("    end | " + " | ".join(t.ended.ljust(width) for t in traces))
    lines.append(report.summary)
    lines.append("<< = the rank was in this collective when it ended. '-' = it never issued it. "
                 "Sources: collectives from the flight recorder, 'end' from the launcher.")
    return "\n".join(lines)


def _cell(trace: RankTrace, seq: int) -> str:
    if not trace.dumped:
        return "? (no dump)"
    call = trace.at(seq)
    if call is None:
        return "-"
    return call.label + (" <<" if trace.inside and seq == trace.last else "")


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))
