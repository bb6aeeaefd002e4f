"""The pitfall registry, the coverage table and the README block it feeds, and the
metadata of every committed notebook."""

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_lib.authoring import coverage
from course_lib.authoring.cell_schema import read_cells
from course_lib.authoring.gate import notebook_paths
from course_lib.pitfalls import PITFALLS

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("notebooks", "solutions", "exercises")


def declare(pid, role):
    meta = {"course": {"pitfall": pid, "role": role, "symptom": {"observed": "x"}}}
    return new_code_cell("", metadata=meta)


def test_registry_holds_every_id_of_the_curriculum():
    expected = ([f"P{i:02d}" for i in range(1, 21)] + [f"S{i}" for i in range(1, 6)]
                + [f"B{i}" for i in range(1, 4)] + [f"X{i}" for i in range(1, 6)])
    assert list(PITFALLS)[: len(expected)] == expected
    assert all(p.title and p.lessons for p in PITFALLS.values())


def test_table_lists_every_id_with_its_cells_or_to_come(tmp_path):
    nbformat.write(new_notebook(cells=[new_code_cell("x"), declare("P04", "broken"),
                                       declare("P04", "fixed")]), tmp_path / "03_data.ipynb")
    covered, problems = coverage.collect([tmp_path / "03_data.ipynb"])
    table = coverage.table(covered)
    assert problems == []
    rows = [r for r in table.splitlines() if r.startswith("| ") and not r.startswith("| id ")]
    assert [r.split(" | ")[0][2:] for r in rows] == list(PITFALLS)
    assert "| P04 | " in table and "| `03_data` broken, fixed (observed x) |" in table
    assert "| as P04: `03_data` broken, fixed (observed x) |" in table  # S4 is P04
    assert f"2 of {len(PITFALLS)} pitfalls" in table
    assert table.count("| to come |") == len(PITFALLS) - 2


def test_rows_count_roles_and_name_symptoms_but_not_positions(tmp_path):
    """Editing a lesson (a cell added above a pitfall) leaves README's table as it was."""
    zero = {"error": "ZeroDivisionError", "match": "by zero"}
    cells = [declare("P10", "broken"), declare("P10", "fixed"), declare("P10", "broken"),
             new_code_cell("", metadata={"course": {"pitfall": "P10", "role": "demo",
                                                    "symptom": zero},
                                         "tags": ["raises-exception"]}),
             declare("P10", "fixed")]
    nbformat.write(new_notebook(cells=cells), tmp_path / "04_a.ipynb")
    before = coverage.table(coverage.collect([tmp_path / "04_a.ipynb"])[0])
    assert "| `04_a` 2 broken, 2 fixed, demo (observed x, ZeroDivisionError('by zero')) |" \
        in before
    nbformat.write(new_notebook(cells=[new_markdown_cell("new prose"), *cells]),
                   tmp_path / "04_a.ipynb")
    assert coverage.table(coverage.collect([tmp_path / "04_a.ipynb"])[0]) == before


def test_unknown_ids_and_incomplete_pairs_fail_the_coverage_command(tmp_path, capsys):
    nbformat.write(new_notebook(cells=[declare("X77", "demo"), declare("P05", "broken")]),
                   tmp_path / "05_bad.ipynb")
    assert coverage.report([tmp_path / "05_bad.ipynb"], write_readme=False) == 1
    err = capsys.readouterr().err
    assert "'X77' is not in the registry" in err and "no fixed partner" in err


def test_write_readme_replaces_only_the_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{coverage.START}\nold\n{coverage.END}\noutro\n")
    assert coverage.report([], write_readme=True, readme=readme) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{coverage.END}\noutro\n")
    assert "old" not in text and "| P01 |" in text
    with pytest.raises(ValueError, match="needs the lines"):
        coverage.replace_block("no markers", "table")


def test_readme_coverage_block_is_up_to_date():
    covered, _ = coverage.collect(notebook_paths([str(ROOT / "notebooks")]))
    readme = (ROOT / "README.md").read_text()
    fresh = coverage.replace_block(readme, coverage.table(covered))
    assert readme == fresh, ("README.md's pitfall coverage table is stale: run "
                             "python -m course_lib coverage --write-readme")


@pytest.mark.parametrize("path", notebook_paths([str(ROOT / f) for f in FOLDERS]),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_notebook_metadata_is_valid(path):
    _, problems = read_cells(nbformat.read(path, as_version=4))
    assert problems == []
