"""A lesson's check tests as one table per check: each row an answer (the worked solution, a
right answer written otherwise, or a plausible wrong one) and what the check must say of it,
ACCEPTED or the hint that names this answer's mistake. One test function runs every row:

    judged = verdicts_for("07_gradient_accumulation.ipynb", timeout=20)
    TRAIN_STEP = [(Solution("train_step"), ACCEPTED), (not_divided, "without dividing by k")]

    @pytest.mark.parametrize("check, answer, hint", cases(check_train_step, TRAIN_STEP))
    def test_the_check_judges_the_answer(check, answer, hint, capsys):
        judged(check, answer, hint, capsys)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from checking import accepts, load_solution, rejects

ACCEPTED = None  # a row's hint when the check must pass the answer


@dataclass(frozen=True)
class Solution:
    """The worked solution `name`, loaded from the lesson's solutions notebook when its test
    runs (not when the tests are collected)."""

    name: str


def label(answer: object) -> str:
    """A row's name in the test id: "solution", or the answer function's (class's) name."""
    return "solution" if isinstance(answer, Solution) else answer.__name__


def cases(check: Callable, table: list[tuple[object, str | None]]) -> list:
    """The table's rows as parameters (check, answer, hint), named check-answer. Two rows of
    one answer (two hints) get pytest's counter: wrap_static0, wrap_static1."""
    name = check.__name__.removeprefix("check_")
    return [pytest.param(check, answer, hint, id=f"{name}-{label(answer)}")
            for answer, hint in table]


def verdicts_for(notebook: str, timeout: float | None = None) -> Callable:
    """judged(check, answer, hint, capsys) for one lesson: the check passes the answer (hint
    ACCEPTED), or fails it with a message that holds the hint, and prints that message."""

    def judged(check: Callable, answer: object, hint: str | None, capsys) -> None:
        fn = load_solution(notebook, answer.name) if isinstance(answer, Solution) else answer
        if hint is ACCEPTED:
            accepts(check, fn, capsys, timeout)
        else:
            rejects(check, fn, hint, capsys, timeout)

    return judged
