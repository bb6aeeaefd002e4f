"""Shared by the exercise-check tests: load a worked solution from its notebook, and assert
that a check accepts or rejects (with the right hint) what it is given."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import nbformat

from course_lib.protocol import course_meta

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"


def load_solution(notebook: str, name: str) -> Callable:
    """The worked solution `name` from solutions/<notebook>, run as the notebook defines it
    (in a namespace that is not importable, so it travels to the ranks by value)."""
    return load_function(SOLUTIONS / notebook, name)


def load_function(path: Path, name: str) -> Callable:
    """The function `name` as notebook `path` defines it: every code cell but the check cells
    runs, in a namespace that is not importable (so the function travels by value)."""
    nb = nbformat.read(path, as_version=4)
    namespace = {"__name__": f"{path.parent.name}_{path.name.split('_')[0]}"}
    for cell in nb.cells:
        if cell.cell_type == "code" and course_meta(cell).get("exercise") != "check":
            exec(compile(cell.source, path.name, "exec"), namespace)
    return namespace[name]


def accepts(check, fn, capsys, timeout: float | None = None) -> None:
    result = check(fn) if timeout is None else check(fn, timeout=timeout)
    printed = capsys.readouterr().out
    assert result.passed, result.message
    assert "PASS" in printed and result.message in printed


def rejects(check, fn, hint, capsys, timeout: float | None = None) -> None:
    result = check(fn) if timeout is None else check(fn, timeout=timeout)
    printed = capsys.readouterr().out
    assert not result.passed
    assert hint in result.message, result.message
    assert result.message in printed


def check_helpers(notebook: str, timeout: float | None = None):
    """(solution, accepts, rejects) bound to one solutions notebook and check timeout."""
    return (partial(load_solution, notebook), partial(accepts, timeout=timeout),
            partial(rejects, timeout=timeout))
