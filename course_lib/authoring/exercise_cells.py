"""The gate's rules for exercise cells (metadata course.exercise): in an exercise notebook
stubs may raise only NotImplementedError and every check must stop at its stub with it; in
a solutions notebook every check must show a passed result."""

from __future__ import annotations

from typing import Any

from course_lib.authoring.outputs import (
    Verdict,
    check_results,
    describe_error,
    error_output,
    executed,
)
from course_lib.protocol import CHECK, EXERCISE, STUB, course_meta

STUB_ERROR = "NotImplementedError"


def judge_exercise_cells(nb: Any) -> list[Verdict]:
    """A verdict for every stub and check cell; an exercise notebook is one with stubs."""
    parts = [(n, course_meta(c).get(EXERCISE), c) for n, c in enumerate(nb.cells, start=1)]
    has_stubs = any(part == STUB for _, part, _ in parts)
    verdicts = []
    for number, part, cell in parts:
        if part == STUB:
            verdicts.append(_judge(number, "exercise stub", cell, stub_ok=True))
        elif part == CHECK:
            verdicts.append(_judge(number, "exercise check", cell, stub_ok=False)
                            if has_stubs else _judge_solution_check(number, cell))
        elif part is not None:
            verdicts.append(Verdict(number, f"exercise {part!r}", "'stub' or 'check'",
                                    "an unknown course.exercise value", False))
    return verdicts


def _judge(number: int, what: str, cell: Any, stub_ok: bool) -> Verdict:
    """Stubs may pass or raise NotImplementedError; checks must raise it."""
    expects = f"no error or {STUB_ERROR}" if stub_ok else STUB_ERROR
    if not executed(cell):
        return Verdict(number, what, expects, "the cell was not executed", False)
    err = error_output(cell)
    ok = (err is None and stub_ok) or (err is not None and err.get("ename") == STUB_ERROR)
    return Verdict(number, what, expects, describe_error(err), ok)


def _judge_solution_check(number: int, cell: Any) -> Verdict:
    results = check_results(cell) if executed(cell) else []
    err = error_output(cell)
    if err is not None or not results:
        saw = describe_error(err) if err is not None else "no check result in the outputs"
        return Verdict(number, "solution check", "check passed", saw, False)
    passed = all(r.get("passed") is True for r in results)
    saw = "passed" if passed else f"failed: {results[-1].get('message', '')}"
    return Verdict(number, "solution check", "check passed", saw, passed)
