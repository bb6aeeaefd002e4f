"""The course's run time as committed: docs/run_times.json (from a full test run), the
README table and every lesson's "Run time" line agree, and no notebook is missing."""

import json
from pathlib import Path

import nbformat
import pytest

from course_lib.authoring import run_times

ROOT = Path(__file__).resolve().parents[1]
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tmp.abc.notebooks.03_data.ipynb" name="03_data.ipynb" time="41.26" />
<testcase classname="tmp.abc.exercises.03_data.ipynb" name="03_data.ipynb" time="6.04" />
<testcase classname="tests.test_launch" name="test_something" time="1.0" />
</testsuite></testsuites>"""


def committed() -> dict[str, float]:
    return json.loads((ROOT / run_times.TIMES).read_text())


def test_every_notebook_has_a_measured_time():
    assert sorted(committed()) == run_times.notebooks(ROOT), (
        "docs/run_times.json is stale: run scripts/test, then "
        "python -m course_lib run-times --write artifacts/junit.xml")


def test_readme_table_is_the_committed_times():
    readme = (ROOT / "README.md").read_text()
    assert f"{run_times.START}\n{run_times.table(committed())}\n{run_times.END}" in readme


@pytest.mark.parametrize("name", [n for n in run_times.notebooks(ROOT)
                                  if n.startswith("notebooks/")])
def test_each_lesson_states_its_measured_time(name):
    first = nbformat.read(ROOT / name, as_version=4).cells[0].source
    assert run_times.header_line(committed()[name]) in first


def test_times_are_read_from_nbmake_junit(tmp_path):
    (tmp_path / "j.xml").write_text(JUNIT)
    assert run_times.from_junit(tmp_path / "j.xml") == {"notebooks/03_data.ipynb": 41.3,
                                                       "exercises/03_data.ipynb": 6.0}


def test_writing_needs_the_line_in_the_lesson(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Lesson")])
    nbformat.write(nb, tmp_path / "03.ipynb")
    with pytest.raises(ValueError, match="Run time"):
        run_times.set_header(tmp_path / "03.ipynb", 40.0)
