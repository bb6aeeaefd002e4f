"""What a rank sends home beside its return value: a registry that the launcher's rank side
reads and telemetry (or the x-ray) writes to, so that neither imports the other.

Two ways in, one way home (launching/rank_record.py carries both to `Run.extras`):
- `register_collector(name, collect)`: `collect()` is called once, when the rank returns,
  raises, or is stopped by the launcher (a hang, a peer's failure);
- `journal(name, value)`: `value` is written down now, so that a rank killed by a signal
  (gloo's abort) still leaves it; the kernel gets the list of journaled values for a name
  that no `collect()` brought home.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# name -> function returning plain picklable data; nothing registered costs nothing.
_collectors: dict[str, Callable[[], Any]] = {}
# The launcher's journal writer in a rank (none elsewhere: journal() then does nothing).
_journal: list[Callable[[str, Any], None]] = []


def register_collector(name: str, collect: Callable[[], Any]) -> None:
    """Send `collect()` back to the kernel with this rank's result (see Run.extras)."""
    _collectors[name] = collect


def registered() -> dict[str, Callable[[], Any]]:
    """The registered collectors, by name."""
    return dict(_collectors)


def journal(name: str, value: Any) -> None:
    """Write `value` (picklable) under `name` to this rank's record now: it reaches
    Run.extras[rank][name] (a list, in order) even if the rank dies before it can send."""
    for write in _journal:
        write(name, value)


def journal_to(write: Callable[[str, Any], None] | None) -> None:
    """Where journal() writes in this process (the launcher's rank side sets it)."""
    _journal[:] = [write] if write is not None else []
