"""Shared by every exercise check: run the learner's function on real ranks, turn a crash
or hang into a hint, and show one CheckResult."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from course_lib.checks.result import CheckResult
from course_lib.launch import DistributedError, launch

# Seconds a check waits for the learner's function; a hang ends with a hint, not a stuck kernel.
CHECK_TIMEOUT = 15.0
SUMMARY_CHARS = 300


class Rejected(Exception):
    """A wrong answer: the message is the hint the learner sees."""


def on_ranks(runner: Callable, fn: Callable, world_size: int, args: tuple = (),
             timeout: float = CHECK_TIMEOUT, pg_timeout: float | None = None,
             known: Sequence[tuple[str, str]] = ()) -> list[Any]:
    """Results of runner(fn, *args) on each of `world_size` fresh CPU (gloo) ranks, on any
    machine: the exercises are CPU exercises.

    Raises NotImplementedError when fn is still the exercise stub, Rejected with a hint
    when any rank crashed or hung. A failure whose text (message, traceback or hung stack)
    contains a `known` fragment gets that fragment's hint (checked in order) first."""
    try:
        run = launch(runner, world_size, args=(fn, *args), timeout=timeout, backend="gloo",
                     pg_timeout=pg_timeout, echo=False)
    except DistributedError as err:
        name = getattr(fn, "__name__", "your function")
        if any(f.error_type == "NotImplementedError" for f in err.failures):
            raise NotImplementedError(
                f"{name}() is not written yet: replace its TODO with your code, run that "
                "cell, then run this check again.") from None
        raise Rejected(_known_hint(err, known) or explain(err, name, world_size, timeout)) \
            from None
    return run.results


def _known_hint(err: DistributedError, known: Sequence[tuple[str, str]]) -> str | None:
    """The hint of the first `known` fragment that some rank's error or stack shows."""
    for fragment, hint in known:
        showing = [f for f in err.failures if fragment in f"{f.message}\n{f.traceback}\n{f.stack}"]
        if showing:  # the rank whose error or stack shows it, e.g. the one stuck inside
            return f"{hint}\n  rank {showing[0].rank}: {shorten(showing[0].summary)}"
    return None


def shorten(text: str, limit: int = SUMMARY_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def explain(err: DistributedError, name: str, world_size: int, timeout: float) -> str:
    """A hint for a failed launch, naming the root-cause rank and what happened to it."""
    root = err.failures[0]
    if err.timed_out:
        hint = (f"{name}() did not finish within {timeout:g} s on {world_size} ranks: a rank is "
                "probably waiting in a collective that another rank never calls. Every rank "
                "must call the same collectives in the same order.")
    elif root.is_consequence:
        hint = (f"rank {root.rank} failed inside a collective, waiting for the other ranks: "
                "every rank must make the same collective calls with the same arguments "
                "(same src, same shapes) in the same order; no `if rank == 0:` around "
                "all_reduce or broadcast.")
    else:
        hint = f"{name}() raised an error on rank {root.rank} (of {world_size} ranks)."
    return f"{hint}\n  root cause, rank {root.rank}: {shorten(root.summary)}"


def run_check(check: str, fn: Any, judge: Callable[[], str]) -> CheckResult:
    """Show and return the result of judge(): its return value is the pass message, a
    Rejected its hint."""
    if not callable(fn):
        result = CheckResult(check, False, f"{check}() expects your function itself "
                                           f"(its name, without calling it), got {fn!r}")
    else:
        try:
            result = CheckResult(check, True, judge())
        except Rejected as rejected:
            result = CheckResult(check, False, str(rejected))
    result.show()
    return result


def close(a: Any, b: Any, tol: float = 1e-5) -> bool:
    """Floats equal up to a relative tolerance (for sums computed in a different order)."""
    return abs(float(a) - float(b)) <= tol * max(1.0, abs(float(b)))
