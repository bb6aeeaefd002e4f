"""The desync report in words: its summary sentences and the side-by-side text table,
written from the comparison's fields (compare.py) and nothing else."""

from __future__ import annotations

from course_lib.launching.desync_report.compare import Comparison
from course_lib.launching.desync_report.trace import RankTrace
from course_lib.words import listing, nth, ranks

ROWS = 6  # collectives shown before the first difference, at most


def summary(c: Comparison) -> str:
    """The whole summary: what outranks the comparison (`lead`), then the comparison, then
    the call sites whose counts differ (left out when a rank's own exception is the cause)."""
    parts = [lead(c), comparison(c) + _gap(c), "" if c.raised_outside else _site_counts(c)]
    return " ".join(p for p in parts if p)


def lead(c: Comparison) -> str:
    """The sentences that outrank the comparison, "" when none: NCCL is not covered, a
    rank's own exception is the cause, torch's or gloo's own check saw the problem."""
    notes = (_nccl_note(c), _raised_note(c), _torch_note(c), _mismatch_note(c))
    return " ".join(p for p in notes if p)


def comparison(c: Comparison) -> str:
    """The comparison in one or two sentences, without the note on ranks that left no dump.
    "No desync" only when every rank left a dump and nothing else says otherwise."""
    dumped, diff = c.dumped, c.first_difference
    if diff is None:
        n = max((t.last for t in dumped), default=0)
        if not n:
            return ("The flight recorder holds no collective of the default group from any "
                    "rank (monitored_barrier's messages and the group that "
                    "TORCH_DISTRIBUTED_DEBUG=DETAIL wraps are not counted): see each rank's error "
                    "and stack.")
        if c.missing:
            return (f"Rank(s) {listing(sorted(c.missing))} left no flight-recorder dump (a rank "
                    "killed by a signal takes its recorder with it), so what they issued is "
                    f"unknown: this is not shown to be free of a desync. {_issued(dumped, n)}")
        if c.mismatch or c.nccl:
            return f"The recorded collectives agree (each rank issued the same {n})."
        raised = all(t.ended.startswith("raised") for t in dumped)
        stuck = "" if raised else "; a rank stuck outside any collective shows in its stack"
        return (f"The ranks' collectives agree (each issued the same {n} in the same order), "
                f"so this is no desync{stuck}.")
    present = [t for t in dumped if t.at(diff)]
    absent = [t for t in dumped if not t.at(diff)]
    text = f"First difference at collective #{diff}: "
    if absent:
        said = "; ".join(_absent_text(t) for t in absent)
        text += f"{said}, while {_calls_text(present, diff)}."
    else:
        text += f"{_calls_text(dumped, diff)}."
    return text + _site_note(c)


def _gap(c: Comparison) -> str:
    """The note on ranks that left no dump, unless the comparison is already about them."""
    if not c.missing or (c.first_difference is None and any(t.last for t in c.dumped)):
        return ""
    return (f" Rank(s) {listing(sorted(c.missing))} left no flight-recorder dump (a rank killed "
            "by a signal takes its recorder with it): see its output and stack.")


def _nccl_note(c: Comparison) -> str:
    if not c.nccl:
        return ""
    return ("This report does not cover NCCL yet: it reads the flight recorder through "
            "torch._C._distributed_c10d._dump_fr_trace, run here with gloo only; NCCL keeps "
            "its own (dump_nccl_trace) which is not read (not run on a GPU). Go by each "
            "rank's error and stack.")


def _raised_note(c: Comparison) -> str:
    """The root cause when a rank raised an exception of its own, not inside a collective."""
    if not c.raised_outside:
        return ""
    said = "; ".join(f"rank {t.rank} {t.ended} outside any collective ("
                     + (f"after its {nth(t.last)} collective)" if t.last else
                        "before any collective)")
                     for t in c.traces if t.rank in c.raised_outside)
    return (f"{said}: that exception is the cause (its traceback comes first); the table only "
            "shows where the other ranks were waiting for it.")


_CHECKS = {"detail": "TORCH_DISTRIBUTED_DEBUG=DETAIL's check found the ranks in different "
                     "collectives",
           "monitored_barrier": "monitored_barrier named the rank(s) that never reached it"}


def _torch_note(c: Comparison) -> str:
    """What torch's own checks said, raised from the collective call itself."""
    return " ".join(f"{_CHECKS[k.check]} (rank {k.rank}'s error): \"{k.said}\"."
                    for k in c.torch_checks)


def _mismatch_note(c: Comparison) -> str:
    if not c.mismatch:
        return ""
    got = (f" (it received {c.mismatch_bytes[0]} bytes where it expected "
           f"{c.mismatch_bytes[1]})") if c.mismatch_bytes else ""
    return (f"Desync: gloo's own check failed on rank(s) {listing(sorted(c.mismatch))}, "
            f"\"Received data size doesn't match expected size ... collective mismatch\"{got}: "
            "the ranks issued collectives of different sizes or kinds at the same point.")


def _site_counts(c: Comparison) -> str:
    if not c.uneven_sites:
        return ""
    said = "; ".join(f"from {where}: " + ", ".join(f"rank {r} issued {n}"
                                                  for r, n in counts.items())
                     for where, counts in c.uneven_sites)
    return f"Counted per call site, the ranks differ: {said}."


def _issued(dumped: list[RankTrace], n: int) -> str:
    """What the ranks that left a dump issued (one rank: no 'the same')."""
    if len(dumped) == 1:
        return f"Rank {dumped[0].rank} issued {dumped[0].last} collective(s)."
    return (f"{ranks(t.rank for t in dumped).capitalize()} issued the same {n} "
            "collective(s) in the same order.")


def _site_note(c: Comparison) -> str:
    if c.site_split is None:
        return ""
    froms = "; ".join(f"rank {t.rank} from {call.where}" for t in c.dumped
                      if (call := t.at(c.site_split)))
    return (f" Earlier, collective #{c.site_split} matched in kind and shape but came from "
            f"different lines ({froms}): a skipped collective pairs silently with the next one.")


def _absent_text(trace: RankTrace) -> str:
    after = f"after its {nth(trace.last)} collective" if trace.last else "before any collective"
    if trace.ended == "returned":
        return f"rank {trace.rank} returned {after}"
    if trace.ended.startswith("raised"):
        return f"rank {trace.rank} {trace.ended} {after}"
    where = "inside it" if trace.inside else "outside any collective (see its stack)"
    return f"rank {trace.rank} never issued it: {trace.ended} {after}, {where}"


def _calls_text(traces: list[RankTrace], seq: int) -> str:
    """'ranks 0 and 2 were in their 3rd (all_reduce [3], from f, line 12)', by call."""
    groups: dict[tuple[str, str], list[RankTrace]] = {}
    for t in traces:
        call = t.at(seq)
        if call is not None:
            groups.setdefault((call.label, call.where), []).append(t)
    parts = []
    for (label, where), ts in groups.items():
        one = len(ts) == 1
        state = f"{'was' if one else 'were'} in" if all(t.inside for t in ts) else "issued"
        parts.append(f"{ranks(t.rank for t in ts)} {state} {'its' if one else 'their'} "
                     f"{nth(seq)} ({label}, from {where})")
    return "; ".join(parts)


# -- the text table ----------------------------------------------------------------------------

def table(c: Comparison, summary_text: str) -> str:
    """The side-by-side text table, the first difference marked with >>, then the summary."""
    traces, diff = c.traces, c.first_difference
    end = max((t.last for t in traces), default=0)
    first = max(1, (diff if diff is not None else end) - ROWS + 1)
    first = max(first, max((t.calls[0].seq for t in traces if t.calls), default=1))
    width = max(18, *(len(call.label) + 3 for t in traces for call in t.calls
                      if call.seq >= first), *(len(t.ended) for t in traces))
    head = "      # | " + " | ".join(f"rank {t.rank}".ljust(width) for t in traces)
    lines = ["Desync report: each rank's collectives, in order (PyTorch's flight recorder, "
             "default group; the launch's own barrier not counted)", head,
             "-" * len(head)]
    for seq in range(first, end + 1):
        mark = ">>" if seq == diff else "  "
        cells = [_cell(t, seq).ljust(width) for t in traces]
        lines.append(f"{mark} {seq:>4} | " + " | ".join(cells))
    lines.append("    end | " + " | ".join(t.ended.ljust(width) for t in traces))
    lines.append(summary_text)
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
