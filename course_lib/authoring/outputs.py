"""Reading executed cells: their error (and whether it reads from the top), observations and
check results, and the Verdict row the gate prints for each judged cell."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from course_lib.protocol import CHECK_MIME, OBSERVATION_MIME

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # IPython colours its tracebacks
COURSE_FRAME = "course_lib" + os.sep  # a traceback line in the course's own code


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


def not_read_from_the_top(err: Any) -> str:
    """Why an error output does not open with its headline, "ename: first line of evalue"
    ("" when it does, or when it shows none of the course's frames: an error of torch's or of
    the learner's own code, which IPython shows as usual). An error the course raises through
    its own code is shown headline first (course_lib/launching/headline.py), so that a learner
    reads what went wrong before any traceback."""
    lines = ANSI.sub("", "\n".join(err.get("traceback", []))).splitlines()
    evalue = str(err.get("evalue", ""))
    headline = f"{err.get('ename')}: {evalue.splitlines()[0] if evalue else ''}".rstrip()
    if (lines and lines[0].rstrip() == headline) or not any(COURSE_FRAME in ln for ln in lines):
        return ""
    return f"its {err.get('ename')} opens with {first_line(lines[0])!r}, not with its headline"


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
