"""Reading executed cells: their error, observations and check results, and the Verdict
row the gate prints for each judged cell."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from course_lib.protocol import CHECK_MIME, OBSERVATION_MIME


@dataclass(frozen=True)
class Verdict:
    """One judged cell: what it is, what it should show, what it showed, and whether right."""

    number: int
    what: str
    expects: str
    saw: str
    ok: bool


def error_output(cell: Any) -> Any | None:
    """The cell's error output, if it raised."""
    return next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)


def describe_error(err: Any | None) -> str:
    """'ename: first line of evalue', or 'no error'."""
    if err is None:
        return "no error"
    return f"{err.get('ename')}: {first_line(str(err.get('evalue', '')))}"


def _displayed(cell: Any, mime: str) -> list[dict]:
    return [o["data"][mime] for o in cell.get("outputs", [])
            if isinstance(o.get("data", {}).get(mime), dict)]


def observations(cell: Any) -> dict[str, list[bool]]:
    """Every observe() value a cell displayed, by name."""
    seen: dict[str, list[bool]] = {}
    for data in _displayed(cell, OBSERVATION_MIME):
        seen.setdefault(str(data.get("name")), []).append(bool(data.get("value")))
    return seen


def check_results(cell: Any) -> list[dict]:
    """Every exercise check result ({check, passed, message}) a cell displayed."""
    return _displayed(cell, CHECK_MIME)


def executed(cell: Any) -> bool:
    return cell.get("execution_count") is not None


def first_line(text: str, width: int = 60) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."
