"""The ranks' collectives lined up: where they first differ, and what outranks that
comparison (NCCL, a rank's own exception, gloo's size check), as fields, not sentences.

Lined up by sequence number, the ranks' lists must agree; the first number where a rank
issued nothing, another collective, or another shape is where the job went wrong.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

from course_lib.launching.desync_report.trace import Call, RankTrace

# gloo's own check (gloo/transport/tcp/pair.cc): "op.preamble.length <= op.nbytes. 64 vs 60.
# Received data size doesn't match expected size. Is there a distributed collective mismatch
# in your code?"; the receiving rank aborts (SIGABRT) with it on stderr.
GLOO_MISMATCH = re.compile(r"Received data size doesn't match|collective mismatch")
_BYTES = re.compile(r"(\d+) vs (\d+)\. Received data size")
# torch's own checks, raised from inside the collective call: TORCH_DISTRIBUTED_DEBUG=DETAIL's
# fingerprint check ("Detected mismatch between collectives on ranks ... Collectives differ
# in the following aspects: ...") and monitored_barrier ("Ranks 2 failed to pass
# monitoredBarrier in 2000 ms"), both in torch 2.13's ProcessGroupWrapper / ProcessGroupGloo.
_DETAIL = re.compile(r"Detected mismatch between collectives.*?differ in the following "
                     r"aspects:\s*(?P<said>[^\n]*)", re.S)
_MONITORED = re.compile(r"(?P<said>Ranks? [\d, ]+ failed to pass monitoredBarrier in \d+ ms)")
SITES_SHOWN = 2  # call sites whose counts differ, at most
# Collectives whose input only the root passes (scatter's list on its source; the others pass
# none, and torch 2.13's recorder lists no input for them): compared by kind alone.
_ROOT_INPUT = {"scatter"}


class TorchCheck(NamedTuple):
    """One of torch's own checks that named the problem: which rank raised it, which check
    ("detail" or "monitored_barrier"), and what it said."""

    rank: int
    check: str
    said: str


@dataclass
class Comparison:
    """What the ranks' collectives show, as fields.

    first_difference: the first sequence number where the ranks differ (None: they agree);
    missing: ranks that left no dump; mismatch: ranks where gloo's size check fired, and
    mismatch_bytes (received, expected) from its message; raised_outside: ranks that raised
    an exception of their own outside any collective (the cause); torch_checks: torch's own
    checks that named the problem (one per check, the first rank's); nccl: the backend was
    NCCL, which the recorder's dump does not cover; site_split: an earlier collective that
    matched in kind and shape but came from different lines; uneven_sites: call sites whose
    collective counts differ between ranks, with each rank's count.
    """

    traces: list[RankTrace]
    first_difference: int | None
    missing: list[int] = field(default_factory=list)
    mismatch: list[int] = field(default_factory=list)
    mismatch_bytes: tuple[int, int] | None = None
    raised_outside: list[int] = field(default_factory=list)
    torch_checks: list[TorchCheck] = field(default_factory=list)
    nccl: bool = False
    site_split: int | None = None
    uneven_sites: list[tuple[str, dict[int, int]]] = field(default_factory=list)

    @property
    def dumped(self) -> list[RankTrace]:
        """The ranks that left a dump, the only ones compared."""
        return [t for t in self.traces if t.dumped]


def compare(traces: list[RankTrace], backend: str = "gloo") -> Comparison:
    """Line up the ranks' collectives and find where they first differ; a rank without a
    dump is never counted as agreeing."""
    diff = first_difference(traces)
    mismatch = [t.rank for t in traces if GLOO_MISMATCH.search(t.text)]
    return Comparison(
        traces, diff, missing=[t.rank for t in traces if not t.dumped], mismatch=mismatch,
        mismatch_bytes=_bytes(traces, mismatch[0]) if mismatch else None,
        raised_outside=[t.rank for t in traces if t.ended.startswith("raised")
                        and not (t.inside or t.collective_error)],
        torch_checks=_torch_checks(traces), nccl=backend == "nccl",
        site_split=_site_split(traces, diff), uneven_sites=_uneven_sites(traces))


def _by_kind(call: Call) -> tuple[str, tuple[tuple[int, ...], ...]]:
    """What must match across ranks: the op, and its input shapes where every rank has one."""
    return (call.op, () if call.op in _ROOT_INPUT else call.sizes)


def first_difference(traces: list[RankTrace],
                     key: Callable[[Call], Hashable] = _by_kind) -> int | None:
    """The first sequence number where a rank issued nothing or something else (by `key`)."""
    traces = [t for t in traces if t.dumped]
    if not traces:
        return None
    start = max((t.calls[0].seq for t in traces if t.calls), default=1)
    end = max(t.last for t in traces)
    for seq in range(start, end + 1):
        calls = [t.at(seq) for t in traces]
        if any(c is None for c in calls) or len({key(c) for c in calls if c}) > 1:
            return seq
    return None


def _bytes(traces: list[RankTrace], rank: int) -> tuple[int, int] | None:
    """(received, expected) from gloo's size-check message on `rank`, None if not given."""
    sizes = _BYTES.search(next(t.text for t in traces if t.rank == rank))
    return (int(sizes[1]), int(sizes[2])) if sizes else None


def _torch_checks(traces: list[RankTrace]) -> list[TorchCheck]:
    """What torch's own checks said, the first rank's words for each check."""
    found: dict[str, TorchCheck] = {}
    for t in traces:
        for check, pattern in (("detail", _DETAIL), ("monitored_barrier", _MONITORED)):
            match = pattern.search(t.text)
            if match and check not in found:
                said = re.sub(r"(\S)vs ", r"\1 vs ", " ".join(match["said"].split()))
                found[check] = TorchCheck(t.rank, check, said)
    return list(found.values())


def _site_split(traces: list[RankTrace], diff: int | None) -> int | None:
    """An earlier collective than `diff` that matched in kind and shape but came from
    different lines: a skipped collective pairs silently with the next one of its shape."""
    if diff is None:
        return None
    dumped = [t for t in traces if t.dumped]
    site = first_difference(dumped, key=lambda c: (*_by_kind(c), c.where))
    return site if site is not None and site < diff else None


def _uneven_sites(traces: list[RankTrace]) -> list[tuple[str, dict[int, int]]]:
    """Collectives counted per call site, where the ranks' counts differ: a skipped DDP
    backward pairs its bucket all-reduces with the next step's, and shows only here."""
    dumped = [t for t in traces if t.dumped]
    if len(dumped) < 2:
        return []
    counts = {t.rank: Counter(c.where for c in t.calls) for t in dumped}
    sites = list(dict.fromkeys(c.where for t in dumped for c in t.calls))
    differ = [w for w in sites if len({counts[r][w] for r in counts}) > 1][:SITES_SHOWN]
    return [(w, {r: counts[r][w] for r in sorted(counts)}) for w in differ]
