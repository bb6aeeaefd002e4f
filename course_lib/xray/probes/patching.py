"""All-or-nothing patches: a probe installs every one of its wrappers, or none of them.

A probe lists its patches (the owner, the attribute, the function that wraps the original);
`apply` reads every original first, so an attribute a torch release renamed or removed
raises before anything changed, and the probe's events are simply absent (the x-ray then
says which rules it could not judge, see probes/__init__.py::install_all).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Patch:
    """`owner.name = wrap(owner.name)`: a class or module attribute wrapped by a probe."""

    owner: Any
    name: str
    wrap: Callable[[Any], Any]


def apply(patches: Iterable[Patch]) -> None:
    """Wrap every attribute, or none: each original is read (and wrapped) before the first
    assignment, and assignments already made are undone if a later one fails."""
    planned = []
    for patch in patches:
        original = getattr(patch.owner, patch.name)
        planned.append((patch.owner, patch.name, original, patch.wrap(original)))
    done: list[tuple[Any, str, Any]] = []
    try:
        for owner, name, original, wrapped in planned:
            setattr(owner, name, wrapped)
            done.append((owner, name, original))
    except BaseException:
        for owner, name, original in reversed(done):
            setattr(owner, name, original)
        raise
