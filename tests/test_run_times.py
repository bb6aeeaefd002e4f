"""The course's run time as committed: docs/run_times.json (from a full test run: every
notebook under nbmake, each lesson's Run All in JupyterLab from the browser check), the
README table and every lesson's "Run time" line agree, and no notebook is missing."""

from pathlib import Path

import nbformat
import pytest

from course_lib.authoring import course_map, run_times

ROOT = Path(__file__).resolve().parents[1]
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites>
<testsuite name="pytest" timestamp="2026-11-29T03:04:05.000000">
<testcase classname="tmp.abc.notebooks.03_data.ipynb" name="03_data.ipynb" time="41.26" />
<testcase classname="tmp.abc.solutions.03_data.ipynb" name="03_data.ipynb" time="9.2" />
<testcase classname="tmp.abc.exercises.03_data.ipynb" name="03_data.ipynb" time="6.04" />
<testcase classname="tests.test_launch" name="test_something" time="1.0" />
<testcase classname="tests.test_browser"
          name="test_lesson_runs_all_in_jupyterlab[notebooks/03_data.ipynb]" time="130">
 <properties><property name="open_seconds" value="7.1" />
  <property name="run_all_seconds" value="96.4" />
  <property name="load_before" value="3.9 4.1 2.8" />
  <property name="load_after" value="5.0 4.3 2.9" /></properties></testcase>
<testcase classname="tests.test_browser"
          name="test_lesson_runs_all_in_jupyterlab[notebooks/10_hangs.ipynb]" time="80">
 <properties><property name="open_seconds" value="7.1" />
  <property name="run_all_seconds" value="60.0" />
  <property name="load_before" value="3.9 4.1 2.8" />
  <property name="load_after" value="5.0 4.3 2.9" /></properties>
 <failure message="a cell raised" /></testcase>
</testsuite></testsuites>"""
LAB_03 = {"run_all": 96.4, "open": 7.1, "date": "2026-11-29", "load": "3.9 before, 5.0 after"}


def committed() -> dict:
    return course_map.run_times(ROOT)


def test_every_notebook_has_a_measured_time():
    assert sorted(committed()["nbmake"]["seconds"]) == run_times.notebooks(ROOT), (
        "docs/run_times.json is stale: run scripts/test, then "
        "python -m course_lib run-times --write artifacts/junit.xml")
    assert set(committed()["browser"]) <= set(run_times.notebooks(ROOT))


def test_readme_table_is_the_committed_times():
    readme = (ROOT / "README.md").read_text()
    assert f"{run_times.START}\n{run_times.table(committed())}\n{run_times.END}" in readme


@pytest.mark.parametrize("name", [n for n in run_times.notebooks(ROOT)
                                  if n.startswith("notebooks/")])
def test_each_lesson_states_its_measured_time(name):
    first = nbformat.read(ROOT / name, as_version=4).cells[0].source
    times = committed()
    assert run_times.header_line(times["nbmake"]["seconds"][name],
                                 times["browser"].get(name)) in first


def test_times_are_read_from_nbmake_junit(tmp_path):
    (tmp_path / "j.xml").write_text(JUNIT)
    assert run_times.from_junit(tmp_path / "j.xml") == {"notebooks/03_data.ipynb": 41.3,
                                                       "solutions/03_data.ipynb": 9.2,
                                                       "exercises/03_data.ipynb": 6.0}


def test_run_all_in_jupyterlab_is_read_from_the_browser_checks_that_passed(tmp_path):
    (tmp_path / "j.xml").write_text(JUNIT)
    assert run_times.run_date(tmp_path / "j.xml") == "2026-11-29"
    assert run_times.browser_from_junit(tmp_path / "j.xml", "2026-11-29") == {
        "notebooks/03_data.ipynb": LAB_03}  # 10_hangs failed: its time is not a Run All's


def test_the_load_file_gives_the_runs_load_or_none(tmp_path):
    assert run_times.read_load(tmp_path / "loadavg") is None
    (tmp_path / "loadavg").write_text("start 4.41 3.10 2.00 3/400 123\nend 2.10 2.5 2.2 1/3 9\n")
    assert run_times.read_load(tmp_path / "loadavg") == "4.41 at the start, 2.10 at the end"


def test_table_and_lesson_line_give_run_all_in_jupyterlab_beside_nbmake():
    times = {"nbmake": {"date": "2026-11-29", "load": "4.4 at the start, 2.1 at the end",
                        "seconds": {"notebooks/03_data.ipynb": 41.3,
                                    "solutions/03_data.ipynb": 9.2,
                                    "exercises/03_data.ipynb": 6.0,
                                    "notebooks/10_hangs.ipynb": 20.0}},
             "browser": {"notebooks/03_data.ipynb": LAB_03}}
    table = run_times.table(times)
    assert "full test run of 2026-11-29 on the 2-core CI machine (load average 4.4 at the " \
           "start, 2.1 at the end)" in table
    assert "| `03_data` | 96 s (2026-11-29, load 3.9 before, 5.0 after) | 41 s | 9 s | 6 s |" \
        in table
    assert "| `10_hangs` | not measured yet | 20 s | - | - |" in table
    assert "| **all 4 notebooks** | **96 s** (1 lessons) | | | **76 s** |" in table
    assert run_times.header_line(41.3, LAB_03) == (
        "**Run time:** Run All in JupyterLab took about 95 s on a 2-core CPU (load average "
        "3.9 before, 5.0 after), and about 40 s under nbmake, without a browser; see the "
        "README's run-time table.")


def course_copy(root: Path) -> None:
    """A one-lesson course with the pages the command writes."""
    opening = "# 03 · Data\n\n**Run time:** old\n\n**You will learn**\n- a thing.\n"
    for folder in run_times.FOLDERS:
        (root / folder).mkdir()
        cells = [nbformat.v4.new_markdown_cell(opening if folder == "notebooks" else "# x")]
        nbformat.write(nbformat.v4.new_notebook(cells=cells), root / folder / "03_data.ipynb")
    (root / "docs").mkdir()
    (root / "README.md").write_text(f"R\n{run_times.START}\n{run_times.END}\n")
    (root / course_map.GUIDE).write_text(f"G\n{course_map.START}\n{course_map.END}\n")


def test_the_command_writes_a_full_run_then_adds_a_browser_runs_lessons(tmp_path, monkeypatch):
    course_copy(tmp_path)
    monkeypatch.chdir(tmp_path)
    nbmake_only = JUNIT.split('<testcase classname="tests.test_browser"')[0]
    (tmp_path / "full.xml").write_text(nbmake_only + "</testsuite></testsuites>")
    (tmp_path / "loadavg").write_text("start 4.4 1 1 1/1 1\nend 2.1 1 1 1/1 1\n")
    assert run_times.main(["--write", "full.xml"]) == 0
    times = course_map.run_times(tmp_path)
    assert times["nbmake"]["load"] == "4.4 at the start, 2.1 at the end"
    assert times["browser"] == {}
    (tmp_path / "browser.xml").write_text(JUNIT)
    assert run_times.main(["--browser", "browser.xml"]) == 0
    times = course_map.run_times(tmp_path)
    assert times["browser"] == {"notebooks/03_data.ipynb": LAB_03}
    assert times["nbmake"]["seconds"]["notebooks/03_data.ipynb"] == 41.3  # kept
    lesson = nbformat.read(tmp_path / "notebooks" / "03_data.ipynb", as_version=4)
    assert run_times.header_line(41.3, LAB_03) in lesson.cells[0].source
    assert "96 s in JupyterLab (2026-11-29" in (tmp_path / course_map.GUIDE).read_text()


def test_writing_needs_the_line_in_the_lesson(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Lesson")])
    nbformat.write(nb, tmp_path / "03.ipynb")
    with pytest.raises(ValueError, match="Run time"):
        run_times.set_header(tmp_path / "03.ipynb", run_times.header_line(40.0))
