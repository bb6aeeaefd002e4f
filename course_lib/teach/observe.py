"""observe(): a cell states what it measured, so the pitfall gate can check it.

A broken cell records its symptom as True, its fixed partner records the same name as
False. The value must come from the cell's own run, never be typed in.
"""

from __future__ import annotations

from typing import Any

from course_lib.protocol import OBSERVATION_MIME


class Observation:
    """Displays as one readable line; carries a machine-readable copy for the gate."""

    def __init__(self, name: str, value: bool, detail: str = ""):
        self.name, self.value, self.detail = name, value, detail

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        return {"text/plain": repr(self),
                OBSERVATION_MIME: {"name": self.name, "value": self.value,
                                   "detail": self.detail}}

    def __repr__(self) -> str:
        mark = "YES" if self.value else "no"
        tail = f"  ({self.detail})" if self.detail else ""
        return f"observed {self.name}: {mark}{tail}"


def observe(name: str, value: Any, detail: str = "") -> None:
    """Record and display whether symptom `name` showed in this cell's run."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"observe() needs a symptom name like 'ranks_disagree', got {name!r}")
    from IPython.display import display

    display(Observation(name, bool(value), detail))
