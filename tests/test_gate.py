"""The pitfall gate: metadata is checked, broken cells must show their symptom, fixed
cells must not, and the command fails when a broken cell is harmless or raises the wrong error."""

import os
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from course_lib.authoring.cell_schema import read_cells
from course_lib.authoring.exercise_cells import judge_exercise_cells
from course_lib.authoring.gate import check_executed, main
from course_lib.protocol import CHECK_MIME as CHECK
from course_lib.protocol import OBSERVATION_MIME as OBSERVATION

RAISES = ["raises-exception"]
ZERO = {"error": "ZeroDivisionError", "match": "division by zero"}
DISAGREE = {"observed": "ranks_disagree"}
WORDED_TWICE = {"error": "ZeroDivisionError", "match": ["division by zero", "divided by 0"]}


def pitfall(source, pid, role, symptom, tags=(), outputs=(), count=1):
    meta = {"course": {"pitfall": pid, "role": role, "symptom": symptom}}
    if tags:
        meta["tags"] = list(tags)
    return new_code_cell(source, metadata=meta, outputs=list(outputs), execution_count=count)


def error(ename="ZeroDivisionError", evalue="division by zero"):
    return new_output("error", ename=ename, evalue=evalue, traceback=[])


def observed(value, name="ranks_disagree"):
    return new_output("display_data", data={OBSERVATION: {"name": name, "value": value,
                                                           "detail": ""},
                                            "text/plain": f"observed {name}"})


def notebook(*cells):
    nb = new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def honest_cells(broken_source="1 / 0"):
    return [pitfall(broken_source, "P03", "broken", ZERO, RAISES),
            pitfall("1 / 1", "P03", "fixed", ZERO)]


# -- metadata --------------------------------------------------------------------------------

def test_well_formed_cells_read_without_problems():
    nb = notebook(*honest_cells(), pitfall("", "X4", "broken", DISAGREE),
                  pitfall("", "X4", "fixed", DISAGREE),
                  pitfall("", "X5", "demo", {"error": "RuntimeError", "match": "x"}, RAISES),
                  new_code_cell("plain = True"))
    cells, problems = read_cells(nb)
    assert problems == []
    assert [(c.number, c.pitfall, c.role) for c in cells] == [
        (1, "P03", "broken"), (2, "P03", "fixed"), (3, "X4", "broken"), (4, "X4", "fixed"),
        (5, "X5", "demo")]


@pytest.mark.parametrize("cell, problem", [
    (pitfall("", "P21", "demo", DISAGREE), "is not of the form"),
    (pitfall("", "X99", "demo", DISAGREE), "is not in the registry"),
    (pitfall("", "S4", "demo", DISAGREE), "S4 is the same pitfall as P04: declare P04"),
    (pitfall("", "P03", "borken", DISAGREE), "role 'borken' is not one of"),
    (pitfall("", "P03", "demo", {"error": "ValueError"}), "must be {'error'"),
    (pitfall("", "P03", "demo", {"observed": "two words"}), "must be {'error'"),
    (pitfall("", "P03", "demo", {"error": "ValueError", "match": []}), "must be {'error'"),
    (pitfall("", "P03", "demo", {"error": "ValueError", "match": ["x", ""]}), "must be {'error'"),
    (pitfall("", "P03", "demo", ZERO), "must be tagged 'raises-exception'"),
    (pitfall("", "P03", "broken", ZERO), "must be tagged 'raises-exception'"),
])
def test_bad_metadata_is_named(cell, problem):
    cells, problems = read_cells(notebook(cell))
    assert cells == [] and len(problems) == 1 and problem in problems[0], problems


def test_a_fixed_cell_may_not_hide_errors_and_markdown_may_not_declare():
    fixed = pitfall("", "P03", "fixed", ZERO, RAISES)
    text = new_markdown_cell("prose", metadata={"course": {"pitfall": "P03", "role": "demo",
                                                           "symptom": DISAGREE}})
    _, problems = read_cells(notebook(fixed, text))
    assert "must not be tagged 'raises-exception'" in problems[0]
    assert "non-code cell" in problems[1]


@pytest.mark.parametrize("cells, missing", [
    ([pitfall("", "P03", "broken", DISAGREE)], "no fixed partner"),
    ([pitfall("", "P03", "fixed", DISAGREE)], "no broken partner"),
    ([pitfall("", "P03", "broken", DISAGREE),
      pitfall("", "P04", "fixed", DISAGREE)], "no fixed partner"),
    ([pitfall("", "P03", "broken", DISAGREE),
      pitfall("", "P03", "fixed", {"observed": "other"})], "no fixed partner"),
])
def test_incomplete_pairs_are_named(cells, missing):
    _, problems = read_cells(notebook(*cells))
    assert problems and missing in problems[0], problems


# -- judging executed cells ------------------------------------------------------------------

@pytest.mark.parametrize("cell, ok", [
    (pitfall("", "P03", "broken", ZERO, RAISES, [error()]), True),
    (pitfall("", "P03", "broken", ZERO, RAISES, []), False),  # made harmless
    (pitfall("", "P03", "broken", ZERO, RAISES, [error("ValueError", "bad")]), False),
    (pitfall("", "P03", "broken", ZERO, RAISES, [error(evalue="other text")]), False),
    (pitfall("", "P03", "broken", ZERO, RAISES, [error()], count=None), False),
    (pitfall("", "P03", "broken", WORDED_TWICE, RAISES, [error(evalue="divided by 0")]), True),
    (pitfall("", "P03", "broken", WORDED_TWICE, RAISES, [error(evalue="other")]), False),
    (pitfall("", "P03", "fixed", ZERO, (), []), True),
    (pitfall("", "P03", "fixed", ZERO, (), [error("ValueError", "bad")]), False),
    (pitfall("", "X4", "broken", DISAGREE, (), [observed(True)]), True),
    (pitfall("", "X4", "broken", DISAGREE, (), [observed(False)]), False),
    (pitfall("", "X4", "broken", DISAGREE, (), [observed(True, "other")]), False),
    (pitfall("", "X4", "fixed", DISAGREE, (), [observed(False)]), True),
    (pitfall("", "X4", "fixed", DISAGREE, (), [observed(True)]), False),
    (pitfall("", "X4", "fixed", DISAGREE, (), []), False),  # absent proves nothing
    (pitfall("", "X4", "fixed", DISAGREE, (), [observed(False), observed(True)]), False),
])
def test_each_cell_is_judged_by_its_outputs(cell, ok):
    report = check_executed("nb", notebook(cell))
    assert [v.ok for v in report.verdicts] == [ok]


def test_an_error_in_an_untagged_cell_is_a_problem():
    report = check_executed("nb", notebook(new_code_cell("x", outputs=[error()],
                                                         execution_count=1)))
    assert not report.ok and "unexpected ZeroDivisionError" in report.problems[0]


LAUNCHER = os.path.join("site-packages", "course_lib", "launching", "launcher.py")


@pytest.mark.parametrize("traceback, problem", [
    (["\x1b[31mDistributedError\x1b[0m: rank 1 failed", "", "Raised from your code:",
      "  Cell In[3], line 1"], False),  # headline first (launching/headline.py)
    (["-" * 40, "DistributedError    Traceback (most recent call last)",
      f"File {LAUNCHER}:80, in launch", "DistributedError: rank 1 failed"], True),
    (["-" * 40, "RuntimeError    Traceback (most recent call last)",
      "File torch/distributed/distributed_c10d.py:2, in all_reduce"], False),  # torch's own
])
def test_an_error_raised_through_the_course_reads_from_its_headline(traceback, problem):
    err = new_output("error", ename="DistributedError", evalue="rank 1 failed\nmore",
                     traceback=traceback)
    cell = new_code_cell("launch(f, 2)", metadata={"tags": RAISES}, outputs=[err],
                         execution_count=1)
    problems = check_executed("nb", notebook(cell)).problems
    assert [p for p in problems if "not with its headline" in p] == (
        [f"cell 1: its DistributedError opens with {'-' * 40!r}, not with its headline: "
         "raise it through course_lib.launching.headline.headline_first"]
        if problem else [])


def exercise_cell(part, outputs, tags=RAISES):
    return new_code_cell("", metadata={"course": {"exercise": part}, "tags": list(tags)},
                         outputs=outputs, execution_count=1)


def check_shown(passed):
    return new_output("display_data", data={CHECK: {"check": "c", "passed": passed,
                                                     "message": "m"}, "text/plain": "m"})


@pytest.mark.parametrize("cells, oks", [
    ([exercise_cell("stub", []), exercise_cell("check", [error("NotImplementedError")])],
     [True, True]),
    ([exercise_cell("stub", [error("ValueError")]), exercise_cell("check", [])],
     [False, False]),
    ([exercise_cell("check", [check_shown(True)], tags=())], [True]),
    ([exercise_cell("check", [check_shown(False)], tags=())], [False]),
    ([exercise_cell("check", [], tags=())], [False]),
    ([exercise_cell("answer", [])], [False]),
])
def test_exercise_cells_are_judged(cells, oks):
    assert [v.ok for v in judge_exercise_cells(notebook(*cells))] == oks


# -- the command, on real kernels ------------------------------------------------------------

def run_gate(*args):
    done = subprocess.run([sys.executable, "-m", "course_lib", "gate", *map(str, args)],
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout


@pytest.mark.kernel  # the gate executes four notebooks in kernels
def test_the_command_passes_honest_notebooks_and_fails_dishonest_ones(tmp_path):
    honest = notebook(
        new_code_cell("from course_lib import observe"), *honest_cells(),
        pitfall("observe('ranks_disagree', [1, 2] != [1, 1])", "X4", "broken", DISAGREE),
        pitfall("observe('ranks_disagree', [1, 1] != [1, 1])", "X4", "fixed", DISAGREE))
    paths = {"honest": honest, "harmless": notebook(*honest_cells("1 / 2")),
             "unrelated": notebook(*honest_cells("int('x')")),
             "untagged": notebook(*honest_cells(), new_code_cell("int('x')"))}
    for name, nb in paths.items():
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
    assert run_gate(tmp_path / "honest.ipynb")[0] == 0
    code, out = run_gate(*(tmp_path / f"{n}.ipynb" for n in ("harmless", "unrelated",
                                                              "untagged")))
    assert code == 1
    harmless, unrelated, untagged = out.split("FAIL  ")[1:]
    assert "P03 broken" in harmless and "no error" in harmless and "NO" in harmless
    assert "ValueError: invalid literal" in unrelated and "NO" in unrelated
    assert "execution stopped at an unexpected ValueError" in untagged


def test_executed_notebooks_are_judged_without_running_them(tmp_path, capsys):
    nbformat.write(notebook(pitfall("1 / 0", "P03", "broken", ZERO, RAISES, [error()]),
                            pitfall("1 / 1", "P03", "fixed", ZERO)), tmp_path / "done.ipynb")
    (tmp_path / "fresh").mkdir()
    never_run = notebook(pitfall("1 / 0", "P03", "broken", ZERO, RAISES, count=None),
                         pitfall("1 / 1", "P03", "fixed", ZERO, count=None))
    nbformat.write(never_run, tmp_path / "fresh" / "never_run.ipynb")
    assert main(["--executed", str(tmp_path / "done.ipynb")]) == 0
    assert main(["--executed", str(tmp_path / "fresh")]) == 1
    assert "the cell was not executed" in capsys.readouterr().out


def test_a_folder_without_notebooks_is_an_error_not_a_pass(tmp_path):
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path)])
    assert stopped.value.code == 2
