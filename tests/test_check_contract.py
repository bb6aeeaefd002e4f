"""The contract every exercise check keeps, tested for every check at once: a stub raises
NotImplementedError naming the function, a non-callable gets a clear error, the kernel's
random state is left alone, and the worked solution passes at two world sizes (one of them 3
or 4) within the check's own time limit.

The checks are found where the course uses them: the `check_*(function)` calls in
solutions/*.ipynb and the `course_lib.checks` module each notebook imports them from. A new
lesson gets these tests without editing this file."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import random
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import nbformat
import numpy as np
import pytest
import torch
from checking import EXERCISES, SOLUTIONS, load_function

import course_lib.checks
from course_lib.checks import common
from course_lib.protocol import stub_message


@dataclass(frozen=True)
class Case:
    """One check cell of a solutions notebook: `check(function)`."""

    notebook: str
    module: str
    check: str
    function: str

    def __str__(self) -> str:
        return f"{self.notebook.split('_')[0]}:{self.check}"

    def check_fn(self):
        return getattr(importlib.import_module(self.module), self.check)


def _cell_trees(path: Path) -> list[ast.Module]:
    """The parsed code cells of a notebook (cells that are not plain Python are skipped)."""
    trees = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            try:
                trees.append(ast.parse(cell.source))
            except SyntaxError:  # a %magic cell: no check call to find there
                continue
    return trees


def discover(folder: Path = SOLUTIONS) -> list[Case]:
    """Every `check_*(name)` call in the folder's notebooks, with the module it comes from."""
    cases = []
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        trees = _cell_trees(path)
        source = {alias.asname or alias.name: node.module
                  for tree in trees for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.module
                  and node.module.startswith("course_lib.checks")
                  for alias in node.names}
        for tree in trees:
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id.startswith("check_") and node.args
                        and isinstance(node.args[0], ast.Name)):
                    cases.append(Case(path.name, source.get(node.func.id, ""), node.func.id,
                                      node.args[0].id))
    return cases


CASES = discover()


def lesson_checks() -> set[str]:
    """Every check_* function of a lesson, named by the lesson's import path: one defined in
    a course_lib.checks.lessonNN module, or in a module of a lessonNN package (a lesson split
    one module per exercise re-exports its checks)."""
    found = set()
    for info in pkgutil.walk_packages(course_lib.checks.__path__, "course_lib.checks."):
        lesson = ".".join(info.name.split(".")[:3])
        if lesson.rsplit(".", 1)[-1].startswith("lesson"):
            module = importlib.import_module(info.name)
            found |= {f"{lesson}.{name}" for name, obj in vars(module).items()
                      if name.startswith("check_") and inspect.isfunction(obj)
                      and obj.__module__ == module.__name__}
    return found


def test_every_check_has_a_solution_cell():
    assert len({f"{c.module}.{c.check}" for c in CASES}) == len(lesson_checks())
    for case in CASES:
        assert case.module, f"{case}: {case.notebook} calls {case.check} without importing it"
        assert case.module.startswith("course_lib.checks.lesson"), \
            f"{case}: notebooks import checks from their lesson's module, not {case.module}"
    missing = lesson_checks() - {f"{c.module}.{c.check}" for c in CASES}
    assert not missing, f"checks no solutions notebook calls: {sorted(missing)}"


def limit_of(check) -> float:
    """The check's own time limit: the default of its `timeout` parameter."""
    parameter = inspect.signature(check).parameters.get("timeout")
    assert parameter is not None, f"{check.__name__} must accept timeout=..."
    return parameter.default


# -- (a) a stub, (b) a non-callable -----------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_stub_raises_not_implemented_naming_the_function(case, capsys):
    stub = load_function(EXERCISES / case.notebook, case.function)
    with pytest.raises(NotImplementedError, match=rf"{case.function}\(\) is not written yet"):
        case.check_fn()(stub)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_non_callable_gets_a_clear_error(case, capsys):
    launches = []
    with mock.patch.object(common, "launch", side_effect=lambda *a, **k: launches.append(a)):
        result = case.check_fn()(None)
    assert not result.passed
    assert "expects your function itself" in result.message, result.message
    assert not launches, "a check must refuse a non-callable before starting ranks"


# -- (c) the random state, (d) the solution, its world sizes and time ------------------------

def random_states() -> tuple:
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def same_states(a: tuple, b: tuple) -> list[str]:
    """Which generators (torch, numpy, random) differ between two random_states()."""
    differ = []
    if not torch.equal(a[0], b[0]):
        differ.append("torch")
    if not (a[1][0] == b[1][0] and np.array_equal(a[1][1], b[1][1]) and a[1][2:] == b[1][2:]):
        differ.append("numpy")
    if a[2] != b[2]:
        differ.append("random")
    return differ


@dataclass
class SolutionRun:
    """What running a check on its worked solution did."""

    passed: bool
    message: str
    seconds: float
    reseeded: list[str]  # the generators of the kernel the check changed
    launches: list[tuple[int, float]] = field(default_factory=list)  # (world size, seconds)


@cache
def run_solution(case: Case) -> SolutionRun:
    """Run the check on its worked solution once per test session, recording every launch."""
    real, launches = common.launch, []

    def timed(fn, world_size, *args, **kwargs):
        start = time.monotonic()
        try:
            return real(fn, world_size, *args, **kwargs)
        finally:
            launches.append((world_size, time.monotonic() - start))

    solution = load_function(SOLUTIONS / case.notebook, case.function)
    torch.manual_seed(1234)
    np.random.seed(1234)
    random.seed(1234)
    before, start = random_states(), time.monotonic()
    with mock.patch.object(common, "launch", timed):
        result = case.check_fn()(solution)
    seconds = time.monotonic() - start
    return SolutionRun(result.passed, result.message, seconds,
                       same_states(before, random_states()), launches)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_solution_passes_within_the_checks_time_limit(case, capsys, record_property):
    run = run_solution(case)
    assert run.passed, run.message
    limit = limit_of(case.check_fn())
    record_property("seconds", round(run.seconds, 2))
    with capsys.disabled():
        shown = ", ".join(f"{n} ranks {s:.1f} s" for n, s in run.launches)
        print(f"\n  {case}: passed in {run.seconds:.1f} s ({shown}; limit {limit:g} s a launch)")
    slowest = max(s for _, s in run.launches)
    assert slowest < limit, f"a launch took {slowest:.1f} s, the check's limit is {limit:g} s"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_kernels_random_state_is_left_alone(case, capsys):
    run = run_solution(case)
    assert not run.reseeded, f"{case.check} changed the kernel's {' and '.join(run.reseeded)} " \
                             "random state: draw the check's own numbers from a " \
                             "torch.Generator, or inside torch.random.fork_rng()"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_runs_at_two_world_sizes_one_of_them_3_or_4(case, capsys):
    sizes = {n for n, _ in run_solution(case).launches}
    assert len(sizes) >= 2 and sizes & {3, 4}, (
        f"{case.check} ran only at world sizes {sorted(sizes)}: an answer right at one size "
        "only would pass. Run it at two sizes at least, one of them 3 or 4 "
        "(common.at_world_sizes).")


# -- the shared base: failures as fields, world sizes, comparisons ----------------------------

def _call(fn):
    return fn()


def _crash_on_rank_1():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ZeroDivisionError("division by zero")
    return 0


def _hang_on_rank_1():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(60)
    return 0


def test_a_crash_is_rejected_with_its_failure_as_fields():
    with pytest.raises(common.Rejected) as caught:
        common.on_ranks(_call, _crash_on_rank_1, 2)
    failure = caught.value.failure
    assert (failure.rank, failure.error_type, failure.world_size) == (1, "ZeroDivisionError", 2)
    assert failure.message == "division by zero" and failure.function == "_crash_on_rank_1"
    assert not failure.timed_out and not failure.consequence
    assert failure.shows("division by zero") == 1 and failure.shows("no such text") is None
    assert "raised an error on rank 1 (of 2 ranks)" in str(caught.value)
    assert "root cause, rank 1: ZeroDivisionError" in str(caught.value)


def test_a_time_limit_hit_is_a_field_and_the_hint_says_the_limit():
    start = time.monotonic()
    with pytest.raises(common.Rejected) as caught:
        common.on_ranks(_call, _hang_on_rank_1, 2, timeout=2)
    assert time.monotonic() - start < 2 + 3  # the hang ends at the limit, not at rank 1's 60 s
    failure = caught.value.failure
    assert failure.timed_out and failure.limit == 2 and failure.rank == 1
    assert failure.kind == "timeout" and failure.consequence
    assert "did not finish within 2 s" in str(caught.value)
    assert "root cause, rank 1: still running at the 2 s timeout" in str(caught.value)
    assert "the check stops the ranks after 2 s" in str(caught.value)


def _stub_on_rank_1():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise NotImplementedError(stub_message("_stub_on_rank_1()"))
    return 0


def _reads_a_meta_tensor():
    return torch.ones(2, device="meta").tolist()  # torch: NotImplementedError, no data


def test_only_the_stubs_not_implemented_error_is_not_written_yet():
    """Review M10: torch raises NotImplementedError too (most ops on the meta device); a
    finished answer that meets one is shown its error, not told to write its TODO."""
    with pytest.raises(common.NotWritten, match=r"_stub_on_rank_1\(\) is not written yet"):
        common.on_ranks(_call, _stub_on_rank_1, 2)
    with pytest.raises(common.Rejected) as caught:
        common.on_ranks(_call, _reads_a_meta_tensor, 2)
    assert caught.value.failure.error_type == "NotImplementedError"
    assert "Cannot copy out of meta tensor" in str(caught.value)
    assert "not written yet" not in str(caught.value)


def test_the_collective_timeout_is_one_formula(monkeypatch):
    """min(hang_after, timeout / 2): half the check's limit stays for the ranks to report."""
    given = []

    def launch(fn, world_size, **options):
        given.append(options["pg_timeout"])
        return SimpleNamespace(results=[None] * world_size)

    monkeypatch.setattr(common, "launch", launch)
    common.on_ranks(_call, _call, 2)
    common.on_ranks(_call, _call, 2, timeout=60, hang_after=2)
    common.on_ranks(_call, _call, 2, timeout=4, hang_after=10)
    assert given == [min(common.HANG_AFTER_S, common.CHECK_TIMEOUT / 2), 2, 2]


# -- @check: the skeleton every check shares ---------------------------------------------------

@common.check
def check_double(fn, timeout: float = 1.0) -> str:
    """Doubles?"""
    if fn(2) != 4:
        raise common.Rejected(f"{fn.__name__}(2) returned {fn(2)}")
    return "it doubles"


def test_a_check_is_named_after_its_judge_and_shows_its_result(capsys):
    assert (check_double.__name__, check_double.__doc__) == ("check_double", "Doubles?")
    assert inspect.signature(check_double).return_annotation == "CheckResult"
    passed, wrong, refused = check_double(lambda x: 2 * x), check_double(abs), check_double(4)
    assert (passed.check, passed.passed, passed.message) == ("check_double", True, "it doubles")
    assert not wrong.passed and wrong.message == "abs(2) returned 2"
    assert not refused.passed and "check_double() expects your function itself" in \
        refused.message
    assert capsys.readouterr().out.splitlines() == [
        "✔ PASS  check_double: it doubles", "✘ NOT YET  check_double: abs(2) returned 2",
        f"✘ NOT YET  check_double: {refused.message}"]


@common.check
def check_runs_on_ranks(fn, timeout: float = 30.0) -> str:
    """Runs on 2 ranks?"""
    common.on_ranks(_call, fn, 2, timeout=timeout)
    return "it ran"


def test_each_check_reports_one_verdict_and_outside_a_hub_nothing_leaves(monkeypatch, capsys):
    """The workshop board's hook (course_lib/board/client.py): one report per check run, with
    (module, check, passed, kind); the shared paths' kinds are "pass", "not-callable" and
    "ranks-exception", a hint's own is where it was raised. Outside a hub (no
    JUPYTERHUB_API_TOKEN) the report starts nothing and posts nothing."""
    from course_lib.board import client

    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    calls, returned, posted = [], [], []
    real = client.report
    monkeypatch.setattr(client, "report", lambda *a: calls.append(a) or returned.append(real(*a)))
    monkeypatch.setattr(client, "_post", lambda *a: posted.append(a))
    check_double(lambda x: 2 * x)
    check_double(4)
    check_double(abs)
    check_runs_on_ranks(_crash_on_rank_1)
    here = check_double.__module__
    assert calls == [(here, "check_double", True, "pass"),
                     (here, "check_double", False, "not-callable"),
                     (here, "check_double", False, f"{here}:check_double+4"),
                     (here, "check_runs_on_ranks", False, "ranks-exception")]
    assert returned == [None] * 4 and posted == []


def test_a_stub_run_in_the_kernel_is_not_written_yet_and_another_error_is_itself(capsys):
    def double(x):
        raise NotImplementedError(stub_message("double()"))

    with pytest.raises(NotImplementedError, match=r"double\(\) is not written yet") as caught:
        check_double(double)
    assert type(caught.value) is NotImplementedError  # the class the gate and the learner see
    assert caught.value._render_traceback_()[0].startswith("NotImplementedError: double()")
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        check_double(lambda x: torch.ones(x, device="meta").tolist())
    assert capsys.readouterr().out == ""  # no verdict shown for either


def test_a_known_fragment_of_pytorchs_error_chooses_the_hint():
    with pytest.raises(common.Rejected) as caught:
        common.on_ranks(_call, _crash_on_rank_1, 2, known=[("division by", "do not divide")])
    assert str(caught.value).startswith("do not divide\n")
    assert caught.value.failure.error_type == "ZeroDivisionError"


def test_a_checks_own_diagnosis_of_a_failure_replaces_the_hint_or_leaves_it():
    seen = []

    def diagnose(failure):
        seen.append((failure.rank, failure.error_type))
        return f"rank {failure.rank} divided by zero" if len(seen) == 1 else None

    for expected in ("rank 1 divided by zero", "_crash_on_rank_1() raised an error on rank 1"):
        with pytest.raises(common.Rejected) as caught:
            common.on_ranks(_call, _crash_on_rank_1, 2, diagnose=diagnose)
        assert str(caught.value).startswith(expected) and caught.value.failure.rank == 1
    assert seen == [(1, "ZeroDivisionError")] * 2


@pytest.mark.parametrize("sizes", [(2,), (3,), (2, 2), (2, 5)])
def test_world_sizes_that_would_let_a_size_specific_answer_pass_are_refused(sizes):
    with pytest.raises(ValueError, match="two sizes at least, one of them 3 or 4"):
        next(common.at_world_sizes(_call, _crash_on_rank_1, sizes))


def test_comparisons_use_one_tolerance():
    want = torch.tensor([1.0, 0.0, 1000.0])
    assert common.same(want + torch.tensor([1e-5, 5e-7, 0.05]), want)
    assert not common.same(want + torch.tensor([0.0, 1e-5, 0.0]), want)
    assert not common.same(want[:2], want) and not common.same([1.0, 0.0, 1000.0], want)
    assert common.differing({"a": want, "b": None}, {"a": want, "b": want, "c": want}) == \
        ["b", "c"]
    assert common.close(1.00005, 1.0) and not common.close(1.001, 1.0)


def test_a_state_snapshot_is_a_detached_copy():
    model = torch.nn.Linear(2, 1)
    state = common.state_snapshot(model)
    with torch.no_grad():
        model.weight.add_(1.0)
    assert not torch.equal(state["weight"], model.weight) and not state["weight"].requires_grad
