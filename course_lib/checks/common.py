"""Shared by every exercise check: run the learner's function on real ranks at several world
sizes, turn a crash or hang into a Rejected that carries the failure as fields, compare with
the true result at one tolerance, and show one CheckResult."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec

import torch

from course_lib.board import client as board_client
from course_lib.checks.result import CheckResult
from course_lib.launching import DistributedError, launch
from course_lib.launching.headline import headline_first
from course_lib.launching.launcher import PG_TIMEOUT_MAX_S
from course_lib.protocol import STUB_MARKER

# Seconds one launch of a check may run before its ranks are stopped and the learner gets a
# hint (a hang never leaves a stuck kernel). Measured on 2 cores shared with other jobs (load
# 7): every worked solution's launch took 0.2-1.8 s (tests/test_check_contract.py prints
# them); a correct read_epochs reading with DataLoader(num_workers=2) took 1.4-8.9 s a launch
# (the slowest the first, which starts the forkserver). 60 s leaves correct work a margin of
# 7x over the slowest; a hang costs the learner this long.
CHECK_TIMEOUT = 60.0
# Seconds a rank waits in a collective before it fails, unless a check says otherwise: a rank
# left waiting by a peer that moved on then fails with its records, and the hint can say how
# far each rank got. One formula for every check: the collective timeout is
# min(hang_after, timeout / 2), so half of the check's time limit is left for the ranks to
# report. A check whose hangs should end sooner sets its own HANG_AFTER_S.
HANG_AFTER_S = PG_TIMEOUT_MAX_S
# The world sizes a check runs at by default: two at least, one of them 3 or 4, so that an
# answer right at one size only ("the other rank" as 1 - rank, a hard-coded 2) is caught.
WORLD_SIZES = (2, 3)
# One tolerance for every comparison with the true result (torch.allclose's rule,
# |got - want| <= ATOL + RTOL * |want|). The ranks add float32 partial sums in another order
# than the one-process reference, which moves a result by a few float32 ulps (1.2e-7
# relative each); RTOL 1e-4 leaves room for that, while every mistake a check names is off
# by far more (a factor of the world size, another rank's data). ATOL covers values near 0.
RTOL, ATOL = 1e-4, 1e-6
SUMMARY_CHARS = 300


@dataclass(frozen=True)
class Failure:
    """How the learner's function failed on the ranks, as fields a hint can branch on."""

    function: str  # the learner's function's name
    world_size: int
    rank: int  # the root-cause rank
    kind: str  # what happened to it: "exception", "exit", "signal", "timeout" or "stopped"
    error_type: str  # e.g. "RuntimeError"; "" when the rank hung or died without one
    message: str  # the error's message ("" when none)
    summary: str  # one line: the error, or how the rank ended
    consequence: bool  # the root cause looks caused by another rank (peer gone, stopped)
    timed_out: bool  # the check's time limit ran out with a rank still running
    limit: float  # that time limit, in seconds
    ranks: tuple[int, ...]  # every rank that failed, root cause first
    error: DistributedError = field(repr=False, compare=False)  # all of it, for `shows`

    @classmethod
    def of(cls, err: DistributedError, function: str, world_size: int,
           limit: float) -> Failure:
        root = err.failures[0]
        return cls(function, world_size, root.rank, root.kind, root.error_type, root.message,
                   root.summary, root.is_consequence, err.timed_out, limit,
                   tuple(err.ranks), err)

    def shows(self, fragment: str) -> int | None:
        """The first rank whose error, traceback or hung stack contains `fragment`."""
        for f in self.error.failures:
            if fragment in f"{f.message}\n{f.traceback}\n{f.stack}":
                return f.rank
        return None

    def details(self) -> str:
        """The lines every failure hint ends with: the root cause, and the time limit when
        it was hit (so a slow but correct answer is told it ran out of time)."""
        lines = [f"  root cause, rank {self.rank}: {shorten(self.summary)}"]
        if self.timed_out:
            lines.append(f"  (the check stops the ranks after {self.limit:g} s; pass a longer "
                         "timeout=... to the check if your machine is slow)")
        return "\n".join(lines)

    def explained(self, hint: str) -> str:
        """`hint`, followed by the details."""
        return f"{hint}\n{self.details()}"


class Rejected(Exception):
    """A wrong answer: the message is the hint the learner sees. `failure` holds how the ranks
    failed when the answer crashed or hung; None when it returned a wrong result. `kind`
    names the hint for the workshop board (course_lib/board): by default where it was raised
    (raised_at); a check that wraps a caught Rejected's text passes that one's kind."""

    def __init__(self, hint: str, failure: Failure | None = None, *, kind: str = "") -> None:
        super().__init__(hint)
        self.failure = failure
        self.kind = kind or raised_at(sys._getframe(1))


def raised_at(frame: Any) -> str:
    """A stable name for a raise site: "lesson10.skip:_judge+14" (the module under
    course_lib.checks, the function, the line counted from the function's first line, its
    decorator's when it has one), unchanged by edits outside that function."""
    module = frame.f_globals.get("__name__", "?").removeprefix("course_lib.checks.")
    code = frame.f_code
    function = getattr(code, "co_qualname", code.co_name).replace(".<locals>", "")  # 3.11+
    return f"{module}:{function}+{frame.f_lineno - code.co_firstlineno}"


class NotWritten(NotImplementedError):
    """The learner's function is still the exercise's stub: its NotImplementedError carries
    `protocol.STUB_MARKER`, which the exercise builder writes."""

    def __init__(self, fn: Any) -> None:
        super().__init__(f"{getattr(fn, '__name__', 'your function')}() is not written yet: "
                         "replace its TODO with your code, run that cell, then run this "
                         "check again.")


def is_stub(error: BaseException | str) -> bool:
    """Whether an error (or its text) is the stub's. Any other NotImplementedError is the
    answer's own (torch raises it for most ops on the meta device, for one)."""
    return isinstance(error, NotWritten) or STUB_MARKER in str(error)


def stopped_at_stub(err: DistributedError) -> bool:
    """Whether some rank of a failed launch raised the stub's NotImplementedError."""
    return any(f.error_type == "NotImplementedError" and is_stub(f.message)
               for f in err.failures)


def on_ranks(runner: Callable, fn: Callable, world_size: int, args: tuple = (),
             timeout: float = CHECK_TIMEOUT, *, hang_after: float = HANG_AFTER_S,
             known: Sequence[tuple[str, str]] = (),
             diagnose: Callable[[Failure], str | None] | None = None) -> list[Any]:
    """Results of runner(fn, *args) on each of `world_size` fresh CPU (gloo) ranks, in rank
    order, on any machine: the exercises are CPU exercises.

    `runner` is a module-level function (it travels by reference) that sets the scene on
    the rank and calls fn. Raises NotWritten when fn is still the exercise stub, and
    Rejected(hint, failure) when a rank crashed or hung: a caller that knows a better hint
    catches it and branches on `failure`'s fields. A rank waiting in a collective fails after
    min(hang_after, timeout / 2) s. `known` pairs a fragment of *PyTorch's* error text (e.g.
    DDP's "Expected to have finished reduction") with the hint it deserves; never match the
    wording of our own messages, branch on fields instead. `diagnose(failure)` is a check's
    own reading of a crash or hang (how far each rank got, where the ranks parted): the whole
    hint, or None for the default."""
    try:
        run = launch(runner, world_size, args=(fn, *args), timeout=timeout, backend="gloo",
                     pg_timeout=min(hang_after, timeout / 2), echo=False)
    except DistributedError as err:
        if stopped_at_stub(err):
            raise NotWritten(fn) from None
        failure = Failure.of(err, getattr(fn, "__name__", "your function"), world_size,
                             timeout)
        hint = diagnose(failure) if diagnose else None
        raise Rejected(hint or failure.explained(_known_hint(failure, known) or explain(failure)),
                       failure, kind=f"ranks-{failure.kind}") from None
    return run.results


def at_world_sizes(runner: Callable, fn: Callable, sizes: Sequence[int] = WORLD_SIZES,
                   args: tuple | Callable[[int], tuple] = (), timeout: float = CHECK_TIMEOUT,
                   **options: Any) -> Iterator[tuple[int, list[Any]]]:
    """(world_size, results of on_ranks) for each size in turn; `args` may be a function of
    the world size. Refuses sizes that would let a size-specific answer pass."""
    if len(set(sizes)) < 2 or not {3, 4} & set(sizes):
        raise ValueError(f"world sizes {tuple(sizes)}: a check runs at two sizes at least, "
                         "one of them 3 or 4")
    for n in sizes:
        yield n, on_ranks(runner, fn, n, args(n) if callable(args) else args, timeout,
                          **options)


def _known_hint(failure: Failure, known: Sequence[tuple[str, str]]) -> str | None:
    """The hint of the first `known` fragment some rank's error or stack shows."""
    for fragment, hint in known:
        rank = failure.shows(fragment)
        if rank is not None:
            return hint if rank == failure.rank else f"{hint}\n  (seen on rank {rank})"
    return None


def shorten(text: str, limit: int = SUMMARY_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def explain(failure: Failure) -> str:
    """The default hint for a failed launch, from its fields."""
    name, n = failure.function, failure.world_size
    if failure.timed_out:
        return (f"{name}() did not finish within {failure.limit:g} s on {n} ranks: a rank is "
                "probably waiting in a collective that another rank never calls. Every rank "
                "must call the same collectives in the same order.")
    if failure.consequence:
        return (f"rank {failure.rank} failed inside a collective, waiting for the other ranks: "
                "every rank must make the same collective calls with the same arguments "
                "(same src, same shapes) in the same order; no `if rank == 0:` around "
                "all_reduce or broadcast.")
    return f"{name}() raised an error on rank {failure.rank} (of {n} ranks)."


P = ParamSpec("P")


def check(judge: Callable[Concatenate[Any, P], str],
          ) -> Callable[Concatenate[Any, P], CheckResult]:
    """A learner-facing check, from its judge: `judge(fn, ...)` runs the learner's function
    `fn` and returns the pass message, or raises Rejected with the hint.

    The check has the judge's name, docstring and parameters. It refuses a non-callable `fn`
    (the learner typed `check_x(f())`), shows the CheckResult once and returns it; when `fn`
    is still its stub it raises a short, fresh NotImplementedError that names `fn`."""
    name = judge.__name__

    @functools.wraps(judge)
    def checked(fn: Any, *args: P.args, **kwargs: P.kwargs) -> CheckResult:
        result = _verdict(name, fn, lambda: judge(fn, *args, **kwargs))
        result.show()
        board_client.report(judge.__module__, name, result.passed, result.kind)
        return result

    checked.__signature__ = inspect.signature(judge).replace(  # type: ignore[attr-defined]
        return_annotation=CheckResult.__name__)
    return checked


def _verdict(check: str, fn: Any, judge: Callable[[], str]) -> CheckResult:
    if not callable(fn):
        return CheckResult(check, False, f"{check}() expects your function itself (its name, "
                                         f"without calling it), got {fn!r}", "not-callable")
    try:
        return CheckResult(check, True, judge(), "pass")
    except Rejected as rejected:
        return CheckResult(check, False, str(rejected), rejected.kind)
    except NotImplementedError as error:
        if not is_stub(error):
            raise  # not the stub's: a real error, shown whole
        stub = NotImplementedError(str(NotWritten(fn)))  # raised afresh: the traceback a
        raise headline_first(stub) from None  # learner sees ends here, not in our machinery


# -- comparing with the true result -----------------------------------------------------------

def close(a: Any, b: Any, rtol: float = RTOL, atol: float = ATOL) -> bool:
    """Numbers equal up to the tolerance, `b` being the true value."""
    return abs(float(a) - float(b)) <= atol + rtol * abs(float(b))


def same(got: Any, want: torch.Tensor, rtol: float = RTOL, atol: float = ATOL) -> bool:
    """`got` is a tensor of `want`'s shape whose values match (compared in float64)."""
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and torch.allclose(got.detach().cpu().double(), want.detach().cpu().double(),
                               rtol=rtol, atol=atol))


def differing(got: dict[str, Any], want: dict[str, torch.Tensor], rtol: float = RTOL,
              atol: float = ATOL) -> list[str]:
    """Names of `want`'s tensors that `got` lacks or holds with other values."""
    return [k for k, w in want.items() if not same(got.get(k), w, rtol, atol)]


def state_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of the model's state_dict, unchanged by later training."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def flat_grad(params: list[torch.Tensor]) -> torch.Tensor:
    """Every parameter's gradient (zeros where there is none) in one float64 vector."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                      for p in params]).detach().double().clone()


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps the gradient it steps with, so a check sees what the learner's loop
    handed the optimizer at each step (and how many steps it took)."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, lr=lr)
        self.seen: list[torch.Tensor] = []

    def step(self, closure: Any = None) -> Any:
        self.seen.append(flat_grad([p for g in self.param_groups for p in g["params"]]))
        return super().step(closure)
