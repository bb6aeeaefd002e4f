"""One clock that every rank on a machine shares: wall-clock seconds, perf_counter resolution."""

from __future__ import annotations

import time

# time.time() is shared by every process on the machine but coarse and may jump;
# perf_counter is fine-grained. Anchor one to the other once per process.
_WALL_NS = time.time_ns()
_PERF_NS = time.perf_counter_ns()


def now() -> float:
    """Seconds since the Unix epoch (like time.time()), with perf_counter's resolution."""
    return (_WALL_NS + time.perf_counter_ns() - _PERF_NS) / 1e9
