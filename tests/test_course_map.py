"""The course map (symptom -> pitfall -> lesson) and the instructor guide's lesson table:
built from the lessons and the registry, new lessons picked up without an edit, and the
committed pages never stale."""

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_lib.__main__ import main as course_main
from course_lib.authoring import course_map
from course_lib.authoring.readme_blocks import replace_block
from course_lib.pitfalls import KINDS, PITFALLS, SAME_AS

ROOT = Path(__file__).resolve().parents[1]
OPENING = "# {n} · {title}\n\n**You will learn**\n- {goal};\n- a second thing.\n\nProse."


def lesson_file(root, stem, title, goal, cells=()):
    """A lesson notebook in root/notebooks with an opening cell and the given cells."""
    (root / "notebooks").mkdir(parents=True, exist_ok=True)
    opening = new_markdown_cell(OPENING.format(n=stem[:2], title=title, goal=goal))
    nbformat.write(new_notebook(cells=[opening, *cells]), root / "notebooks" / f"{stem}.ipynb")


def declare(pid, role, symptom):
    tags = ["raises-exception"] if "error" in symptom and role != "fixed" else []
    meta = {"course": {"pitfall": pid, "role": role, "symptom": symptom}, "tags": tags}
    return new_code_cell("", metadata=meta)


def two_lessons(root):
    hang = {"error": "DistributedError", "match": "Connection closed by peer"}
    lesson_file(root, "03_data", "Data sharding", "why every rank needs a sampler",
                [declare("P03", "broken", {"observed": "same_samples"}),
                 declare("P03", "fixed", {"observed": "same_samples"}),
                 declare("P20", "broken", hang), declare("P20", "fixed", hang)])
    lesson_file(root, "10_hangs", "Hangs", "how to find the rank that hangs",
                [declare("P20", "broken", hang), declare("P20", "fixed", hang)])


def test_every_pitfall_has_a_kind_and_a_symptom_in_a_learners_words():
    missing = [pid for pid, p in PITFALLS.items() if p.kind not in KINDS or not p.symptom]
    assert missing == [], (f"{missing}: give its row in course_lib/pitfalls.py a kind and "
                           f"a symptom (kinds: {', '.join(KINDS)})")
    for pid, other in SAME_AS.items():
        assert PITFALLS[pid].symptom == PITFALLS[other].symptom


def test_map_sends_a_symptom_to_the_lessons_that_show_it(tmp_path):
    two_lessons(tmp_path)
    page = course_map.map_page(course_map.lessons(tmp_path))
    by_symptom = page.split("## Lessons and their pitfalls")[0].splitlines()
    rows = {pid: next(line for line in by_symptom if f" | {pid}: " in line)
            for pid in ("P03", "P13", "P20")}
    p20 = rows["P20"]
    assert p20.startswith(f"| {PITFALLS['P20'].symptom} |")
    assert "[03](../notebooks/03_data.ipynb), [10](../notebooks/10_hangs.ipynb)" in p20
    assert "`Connection closed by peer`" in p20 and "planned" not in p20
    assert "measured: same samples" in rows["P03"]
    assert "| not in a lesson yet | not shown yet |" in rows["P13"]  # lesson 14 absent here
    assert "planned" not in page and "to come" not in page
    under_hang = page.split(f"## {KINDS['hang']}")[1].split("\n## ")[0]
    assert "P20:" in under_hang and "P03:" not in under_hang


def test_map_lists_each_pitfall_once_and_every_lesson(tmp_path):
    two_lessons(tmp_path)
    page = course_map.map_page(course_map.lessons(tmp_path))
    by_symptom = page.split("## Lessons and their pitfalls")[0]
    for pid in PITFALLS:
        assert by_symptom.count(f"| {pid}: ") == (0 if pid in SAME_AS else 1), pid
    assert "| [03 · Data sharding](../notebooks/03_data.ipynb) | P03: " in page
    assert "| [10 · Hangs](../notebooks/10_hangs.ipynb) | P20: " in page


def test_a_new_lesson_appears_in_both_pages_without_an_edit(tmp_path):
    two_lessons(tmp_path)
    lesson_file(tmp_path, "12_repro", "Reproducibility", "how to seed DataLoader workers")
    (tmp_path / "docs").mkdir()
    (tmp_path / course_map.GUIDE).write_text(f"intro\n{course_map.START}\n{course_map.END}\nend\n")
    course_map.write(tmp_path)
    guide = (tmp_path / course_map.GUIDE).read_text()
    assert "### 12 · Reproducibility" in guide and "- how to seed DataLoader workers;" in guide
    assert guide.startswith("intro\n") and guide.endswith(f"{course_map.END}\nend\n")
    assert "[12 · Reproducibility](../notebooks/12_repro.ipynb)" in \
        (tmp_path / course_map.MAP).read_text()


def test_a_lesson_without_its_exercise_yet_links_none(tmp_path):
    two_lessons(tmp_path)
    (tmp_path / "exercises").mkdir()
    nbformat.write(new_notebook(), tmp_path / "exercises" / "03_data.ipynb")
    page = course_map.map_page(course_map.lessons(tmp_path))
    assert "| [03](../exercises/03_data.ipynb) |" in page
    assert "10_hangs.ipynb) | P20: " in page and "| no exercise yet |" in page


@pytest.mark.parametrize("page", [course_map.MAP, course_map.GUIDE, Path("docs/hosting.md"),
                                  Path("docs/pre-workshop-email.md")], ids=str)
def test_every_relative_link_in_the_workshop_pages_resolves(page):
    text = (ROOT / page).read_text()
    targets = re.findall(r"\]\(([^)#:]+)\)", text)  # no ':' leaves out https:// links
    if page in (course_map.MAP, course_map.GUIDE):
        assert any(t.startswith("../notebooks/") for t in targets), page
    missing = [t for t in targets if not (ROOT / "docs" / t).resolve().exists()]
    assert missing == [], f"{page} links to missing files: {missing}"


def test_a_lesson_named_by_the_registry_without_a_cell_is_explained_in_its_text(tmp_path):
    two_lessons(tmp_path)
    lesson_file(tmp_path, "14_torchrun", "Torchrun", "how to start torchrun")
    page = course_map.map_page(course_map.lessons(tmp_path))
    p13 = next(line for line in page.splitlines() if " | P13: " in line)
    assert "| [14](../notebooks/14_torchrun.ipynb) (explained in its text) | not shown yet |" \
        in p13


def test_guide_block_gives_measured_times_or_says_they_are_missing(tmp_path):
    two_lessons(tmp_path)
    all_lessons = course_map.lessons(tmp_path)
    block = course_map.guide_block(all_lessons, course_map.run_times(tmp_path))
    assert "Run All: not measured yet · pitfalls: P03, P20" in block
    assert "Run All in JupyterLab: not measured yet" in block
    (tmp_path / "docs").mkdir()
    lab = {"run_all": 96.4, "open": 7.1, "date": "2026-11-29", "load": "3.9 before, 5.0 after"}
    (tmp_path / course_map.TIMES).write_text(json.dumps(
        {"nbmake": {"date": "2026-11-26", "load": None,
                    "seconds": {"notebooks/03_data.ipynb": 14.6, "solutions/03_data.ipynb": 9.2,
                                "notebooks/10_hangs.ipynb": 30.0}},
         "browser": {"notebooks/03_data.ipynb": lab}}))
    block = course_map.guide_block(all_lessons, course_map.run_times(tmp_path))
    assert ("Run All: 96 s in JupyterLab (2026-11-29, load average 3.9 before, 5.0 after); "
            "15 s (lesson), 9 s (exercise solved) under nbmake · pitfalls: P03, P20") in block
    assert "Run All: 30 s (lesson) under nbmake · pitfalls: P20" in block
    assert ("under nbmake: 45 s, in the full test run of 2026-11-26 on the 2-core CI machine "
            "(load average not recorded)") in block  # 14.6 + 30.0, lessons only
    assert "96 s for the 1 lesson(s) measured" in block


def test_a_lesson_without_a_heading_gets_a_clear_error(tmp_path, capsys, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    nbformat.write(new_notebook(cells=[new_markdown_cell("no heading")]),
                   tmp_path / "notebooks" / "05_x.ipynb")
    with pytest.raises(ValueError, match="needs a heading '# NN · title'"):
        course_map.lessons(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert course_main(["map"]) == 1
    assert "05_x.ipynb: its first cell needs a heading" in capsys.readouterr().err


def test_map_command_prints_the_committed_map(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert course_main(["map"]) == 0
    assert capsys.readouterr().out == (ROOT / course_map.MAP).read_text()


def test_committed_pages_are_up_to_date():
    stale = "is stale: run python -m course_lib map --write"
    all_lessons = course_map.lessons(ROOT)
    assert (ROOT / course_map.MAP).read_text() == course_map.map_page(all_lessons), \
        f"{course_map.MAP} {stale}"
    guide = (ROOT / course_map.GUIDE).read_text()
    block = course_map.guide_block(all_lessons, course_map.run_times(ROOT))
    assert guide == replace_block(guide, block, course_map.START, course_map.END), \
        f"the lessons block of {course_map.GUIDE} {stale}"


def test_the_map_command_never_imports_torch():
    code = ("import contextlib, io, sys\n"
            "from course_lib.__main__ import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['map']) == 0\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
