"""DistributedError: one exception that tells what every failing rank did."""

from __future__ import annotations

import linecache
import multiprocessing
import os
import re
import sysconfig
from dataclasses import dataclass, field

from course_lib.launching.desync_report import DesyncReport
from course_lib.launching.headline import render
from course_lib.launching.run import Run

# Errors that are a consequence of another rank failing, not a cause.
_CONSEQUENCE = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|Timed out waiting|pair closure|"
    r"Socket Timeout|ProcessGroup.*(aborted|destroyed)|NCCL communicator was aborted",
    re.IGNORECASE,
)
# A collective's own failure (a peer gone, a timeout, gloo's size check).
_COLLECTIVE = re.compile(_CONSEQUENCE.pattern + r"|gloo|"
                         r"Detected mismatch between collectives|monitoredBarrier", re.IGNORECASE)


def is_collective_error(message: str) -> bool:
    """True when an error message comes from inside a collective."""
    return bool(_COLLECTIVE.search(message))


@dataclass
class RankFailure:
    """How one rank failed.

    kind: "exception" (the function raised), "exit" (non-zero exit code), "signal"
    (killed by a signal), "timeout" (still running at the timeout), or "stopped"
    (still running after another rank failed, so the launcher stopped it).
    """

    rank: int
    kind: str
    summary: str
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    stack: str = ""
    output_tail: list[str] = field(default_factory=list)
    time: float = 0.0

    @property
    def is_consequence(self) -> bool:
        """True when this failure looks caused by another rank (a dropped connection)."""
        return self.kind in ("stopped", "timeout") or bool(_CONSEQUENCE.search(self.message))

    @property
    def blame(self) -> int:
        """Sort key, likeliest root cause first: a rank's own error, then a rank hung at
        the timeout, then errors caused by a peer (connection closed, collective timed
        out), then ranks the launcher stopped."""
        if self.kind == "stopped":
            return 3
        if self.kind == "timeout":
            return 1
        return 2 if self.is_consequence else 0


class DistributedError(RuntimeError):
    """A launch failed on one or more ranks; `.failures` holds one RankFailure per rank,
    root cause first, `.run` what the ranks printed and sent back before failing, and
    `.desync` the ranks' collectives side by side (a launching.desync_report.DesyncReport, or
    None when the flight recorder was off)."""

    def __init__(self, headline: str, failures: list[RankFailure], timed_out: bool = False,
                 desync: DesyncReport | None = None, run: Run | None = None):
        self.failures = root_cause_first(failures)
        self.timed_out = timed_out
        self.headline = headline
        self.desync = desync
        self.run = run  # launch() always passes one
        super().__init__(format_report(headline, self.failures, desync))

    @property
    def ranks(self) -> list[int]:
        """The ranks that failed, root cause first."""
        return [f.rank for f in self.failures]

    def _render_traceback_(self) -> list[str]:
        """What IPython shows: the headline first, the launcher's frames left out."""
        return render(self)


def root_cause_first(failures: list[RankFailure]) -> list[RankFailure]:
    """Failures ordered by blame, then by when they happened."""
    return sorted(failures, key=lambda f: (f.blame, f.time, f.rank))


# gloo's error when GLOO_SOCKET_IFNAME names an interface this machine does not have.
_NO_INTERFACE = re.compile(r"Unable to find address for: (\S+)")


def advice(failures: list[RankFailure]) -> str:
    """What to do, for a failure whose fix is known ("" when none is)."""
    for f in failures:
        match = _NO_INTERFACE.search(f.message)
        if match:
            return (f"Fix: gloo found no interface named {match[1]!r} on this machine. Set "
                    "GLOO_SOCKET_IFNAME (NCCL: NCCL_SOCKET_IFNAME) to an interface that "
                    "exists and reaches the other ranks (list them: `ip -brief addr`, or "
                    "socket.if_nameindex()), e.g. 'lo' when every rank is on this machine; "
                    "or unset it to use the one the hostname resolves to.")
    return ""


def format_report(headline: str, failures: list[RankFailure],
                  desync: DesyncReport | None = None) -> str:
    """The error's text, read from the top: the headline, a known fix, the root cause's
    traceback, the ranks' collectives side by side, then every other failing rank."""
    first, *others = [_format_failure(f) for f in failures] or [""]
    parts = [headline, advice(failures), first, desync.table() if desync else "", *others]
    return "\n\n".join(p for p in parts if p)


def _format_failure(f: RankFailure) -> str:
    lines = [f"--- rank {f.rank}: {f.summary} ---"]
    if f.traceback:
        lines.append(f.traceback.rstrip())
    if f.stack:
        lines.append("Python stack when stopped (most recent call first):")
        lines.append(f.stack.rstrip())
    if f.output_tail:
        lines.append(f"last output of rank {f.rank}:")
        lines.extend(f"  {line}" for line in f.output_tail)
    return "\n".join(lines)


# -- stacks ------------------------------------------------------------------------------------

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>.*)$')
_STDLIB = sysconfig.get_paths()["stdlib"]
_PLUMBING = (os.path.dirname(multiprocessing.__file__), "<string>")


def annotate_stack(dump: str, launcher_dir: str) -> str:
    """Make a faulthandler dump readable: source lines added, the launcher's own threads
    and frames (and multiprocessing's start-up frames) left out."""
    threads = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip())
    kept = []
    for thread in threads:
        header, *lines = thread.splitlines()
        files = [m["file"] for m in map(_FRAME.match, lines) if m]
        if _innermost_own_file(files).startswith(launcher_dir):
            continue
        hidden = (launcher_dir, *_PLUMBING)
        shown = [_with_source(ln) for ln in lines if not any(h in ln for h in hidden)]
        kept.append("\n".join([header, *shown]))
    return "\n\n".join(kept)


def _innermost_own_file(files: list[str]) -> str:
    """The most recent frame's file outside the standard library ("" if none)."""
    return next((f for f in files if not f.startswith(_STDLIB)), "")


def _with_source(line: str) -> str:
    match = _FRAME.match(line)
    if not match:
        return line
    source = linecache.getline(match["file"], int(match["line"])).strip()
    return f"{line}\n      {source}" if source else line
