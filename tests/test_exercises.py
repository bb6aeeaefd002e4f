"""Exercises come from one source: solutions/ generates exercises/, stubs raise exactly
NotImplementedError, and every solution passes its check."""

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from course_lib.authoring.exercises import main as exercises_main
from course_lib.authoring.gate import gate
from course_lib.authoring.stubs import MarkerError, exercise_notebook, stub_source

ROOT = Path(__file__).resolve().parents[1]

SOLVED = '''def double(x):
    """Twice x."""
    # BEGIN SOLUTION: multiply by two
    y = x * 2
    return y
    # END SOLUTION'''


def test_a_solution_block_becomes_a_todo_that_raises():
    source, count = stub_source(SOLVED)
    assert count == 1
    assert source == ('def double(x):\n    """Twice x."""\n    # TODO: multiply by two\n'
                      '    raise NotImplementedError("TODO: finish double(), then run the check")')
    namespace = {}
    exec(source, namespace)  # the stub must still be valid Python
    with pytest.raises(NotImplementedError):
        namespace["double"](1)


def test_top_level_blocks_and_blocks_without_hint():
    source, count = stub_source("a = 1\n# BEGIN SOLUTION\nb = a + 1\n# END SOLUTION\nprint(a)")
    assert count == 1
    assert source.splitlines() == [
        "a = 1", "# TODO: your code here",
        'raise NotImplementedError("TODO: finish this cell, then run the check")', "print(a)"]


@pytest.mark.parametrize("source, why", [
    ("# BEGIN SOLUTION\nx = 1", "without # END SOLUTION"),
    ("x = 1\n# END SOLUTION", "unexpected or misspelt marker"),
    ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION", "unexpected or misspelt marker"),
    ("#BEGIN SOLUTION\nx = 1\n# END SOLUTION", "unexpected or misspelt marker"),
    ("# BEGIN SOLUTION\nx = 1\n# END SOLUTIONS", "unexpected or misspelt marker"),
])
def test_markers_that_do_not_pair_up_are_refused(source, why):
    with pytest.raises(MarkerError, match=why):
        stub_source(source)


def solutions_notebook():
    check = new_code_cell("check(double)", metadata={"course": {"exercise": "check"}},
                          execution_count=3, outputs=[new_output("stream", text="PASS\n")])
    solved = new_code_cell(SOLVED, execution_count=2, metadata={"tags": ["keep"]})
    nb = new_notebook(cells=[new_markdown_cell("# Exercise\nWrite `double`."),
                             new_code_cell("x = 1", execution_count=1), solved, check])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def test_exercise_notebook_changes_only_stubs_tags_and_outputs():
    nb = solutions_notebook()
    ex = exercise_notebook(nb)
    assert ex.metadata == nb.metadata and len(ex.cells) == len(nb.cells)
    assert ex.cells[0] == nb.cells[0]
    assert all(c.outputs == [] and c.execution_count is None for c in ex.cells[1:])
    assert ex.cells[1].source == "x = 1" and ex.cells[1].metadata == {}
    assert "NotImplementedError" in ex.cells[2].source
    assert ex.cells[2].metadata == {"tags": ["keep", "raises-exception"],
                                    "course": {"exercise": "stub"}}
    assert ex.cells[3].metadata == {"course": {"exercise": "check"},
                                    "tags": ["raises-exception"]}
    assert [c.id for c in ex.cells] == [c.id for c in nb.cells]
    assert nb.cells[3].outputs, "the solutions notebook itself is left alone"


def test_a_notebook_without_a_check_after_its_stub_is_refused():
    nb = solutions_notebook()
    nb.cells = nb.cells[:3]
    with pytest.raises(MarkerError, match="check cell"):
        exercise_notebook(nb)


def test_build_and_check_report_stale_missing_and_orphaned_files(tmp_path, capsys):
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    nbformat.write(solutions_notebook(), sol / "07_demo.ipynb")
    args = ["--solutions", str(sol), "--exercises", str(ex)]
    assert exercises_main(["build", "--check", *args]) == 1
    assert "missing:" in capsys.readouterr().out
    assert exercises_main(["build", *args]) == 0
    assert exercises_main(["build", "--check", *args]) == 0
    changed = solutions_notebook()
    changed.cells[0].source += "\nNow with more words."
    nbformat.write(changed, sol / "07_demo.ipynb")
    assert exercises_main(["build", "--check", *args]) == 1
    assert "out of date:" in capsys.readouterr().out
    (ex / "99_orphan.ipynb").write_text("{}")
    assert exercises_main(["build", *args]) == 0
    assert not (ex / "99_orphan.ipynb").exists()
    assert exercises_main(["build", "--check", *args]) == 0


def test_a_solutions_notebook_without_a_lesson_number_is_refused(tmp_path, capsys):
    (tmp_path / "solutions").mkdir()
    nbformat.write(solutions_notebook(), tmp_path / "solutions" / "demo.ipynb")
    args = ["--solutions", str(tmp_path / "solutions"), "--exercises", str(tmp_path / "ex")]
    assert exercises_main(["build", *args]) == 2
    assert "demo.ipynb: name a solutions notebook after its lesson" in capsys.readouterr().err


def test_committed_exercises_are_up_to_date(capsys):
    args = ["--solutions", str(ROOT / "solutions"), "--exercises", str(ROOT / "exercises")]
    assert exercises_main(["build", "--check", *args]) == 0, capsys.readouterr().out


@pytest.mark.notebooks
def test_stubs_raise_only_not_implemented_and_solutions_pass_their_checks():
    """Lesson 00's pair through the gate, which executes them: for a developer running this
    file. scripts/test leaves it out, as it judges every pair with `python -m course_lib
    gate --executed` on the notebooks nbmake executed once."""
    paths = [ROOT / "solutions" / "00_welcome.ipynb", ROOT / "exercises" / "00_welcome.ipynb"]
    solved, exercise = gate(paths, already_executed=False, timeout=120)
    for report in (solved, exercise):
        assert report.ok, report.problems + [v for v in report.verdicts if not v.ok]
    assert {v.what for v in solved.verdicts} == {"solution check"}
    assert {v.what for v in exercise.verdicts} == {"exercise stub", "exercise check"}
