"""What a rank sends home beside its return value: a registry that the launcher's rank side
reads and telemetry writes to, so that neither imports the other."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# name -> function returning plain picklable data; nothing registered costs nothing.
_collectors: dict[str, Callable[[], Any]] = {}


def register_collector(name: str, collect: Callable[[], Any]) -> None:
    """Send `collect()` back to the kernel with this rank's result (see Run.extras)."""
    _collectors[name] = collect


def collect_all() -> dict[str, Any]:
    """Every registered collector's data, by name."""
    return {name: collect() for name, collect in _collectors.items()}
