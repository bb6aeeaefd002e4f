"""Turn a solutions notebook into its exercise notebook: each block between
`# BEGIN SOLUTION` and `# END SOLUTION` becomes a TODO that raises NotImplementedError."""

from __future__ import annotations

import copy
import re
from typing import Any

from course_lib.protocol import CHECK, COURSE, EXERCISE, RAISES, STUB, course_meta, stub_message

BEGIN = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION(?::[ \t]*(?P<hint>\S.*?))?[ \t]*$")
END = re.compile(r"^[ \t]*# END SOLUTION[ \t]*$")
ANY_MARKER = re.compile(r"#\s*(BEGIN|END)[ _]?SOLUTION", re.IGNORECASE)
DEF = re.compile(r"^(?P<indent>[ \t]*)(async[ \t]+)?def[ \t]+(?P<name>\w+)")


class MarkerError(ValueError):
    """Solution markers that do not pair up, or a notebook with no exercise in it."""


def stub_source(source: str) -> tuple[str, int]:
    """The source with every solution block replaced by a stub, and how many there were."""
    lines, out = source.split("\n"), []
    opened, count = 0, 0  # line number of the open BEGIN marker (0: none open)
    for number, line in enumerate(lines, start=1):
        begin, end = BEGIN.match(line), END.match(line)
        if begin and not opened:
            opened, count = number, count + 1
            out.extend(stub_lines(begin["indent"], begin["hint"], enclosing(lines[:number])))
        elif end and opened:
            opened = 0
        elif begin or end or ANY_MARKER.search(line):
            raise MarkerError(f"line {number}: unexpected or misspelt marker {line.strip()!r}")
        elif not opened:
            out.append(line)
    if opened:
        raise MarkerError(f"line {opened}: # BEGIN SOLUTION without # END SOLUTION")
    return "\n".join(out), count


def stub_lines(indent: str, hint: str | None, function: str | None) -> list[str]:
    """The TODO that stands where a solution was."""
    what = f"{function}()" if function else "this cell"
    return [f"{indent}# TODO: {hint or 'your code here'}",
            f'{indent}raise NotImplementedError("{stub_message(what)}")']


def enclosing(lines: list[str]) -> str | None:
    """The function the last line is in (by indentation), or None at top level."""
    depth = len(lines[-1]) - len(lines[-1].lstrip())
    for line in reversed(lines[:-1]):
        match = DEF.match(line)
        if match and len(match["indent"]) < depth:
            return match["name"]
    return None


def exercise_notebook(nb: Any) -> Any:
    """A copy of the solutions notebook with stubs for solutions and outputs cleared.

    Stub cells and check cells get the raises-exception tag (the checks raise
    NotImplementedError while a stub is left) and course.exercise "stub" / "check"."""
    ex = copy.deepcopy(nb)
    stubs, checks_after = 0, 0
    for number, cell in enumerate(ex.cells, start=1):
        if cell.cell_type != "code":
            continue
        cell.outputs, cell.execution_count = [], None
        try:
            cell.source, count = stub_source(cell.source)
        except MarkerError as exc:
            raise MarkerError(f"cell {number}, {exc}") from None
        part = STUB if count else course_meta(cell).get(EXERCISE)
        if part in (STUB, CHECK):
            _mark(cell, part)
        stubs += count
        checks_after += part == CHECK and stubs > 0
    if not stubs or not checks_after:
        raise MarkerError("a solutions notebook needs at least one solution block and a check "
                          "cell (metadata course.exercise = 'check') after it")
    return ex


def _mark(cell: Any, part: str) -> None:
    cell.metadata.setdefault(COURSE, {})[EXERCISE] = part
    tags = cell.metadata.setdefault("tags", [])
    if RAISES not in tags:
        tags.append(RAISES)
