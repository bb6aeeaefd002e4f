"""A learner's view: every lesson, and one exercise as handed out, in a real JupyterLab in a
real browser (Debian's chromium, driven by Playwright), one server for them all. Run > Run
All Cells must run every code cell; errors may appear only in cells tagged raises-exception;
every figure the kernel draws must be an image in the page and every widget a widget; no
figure text too small to read, no widget label cut off, no character (the 🔴 and ✅ markers
among them) drawn as a missing-glyph box. Each lesson's Run All time goes into the JUnit XML
file. The screenshots land in artifacts/browser/<folder>/<notebook>/. Install with
scripts/install-browser.sh (COURSE_BROWSER=1)."""

import os
import shutil
import time
from pathlib import Path
from typing import NamedTuple

import nbformat
import pytest
from browser_lab import (
    CHROMIUM,
    CHROMIUM_ARGS,
    cut_labels,
    display_problems,
    failing_check_problems,
    jupyterlab,
    missing_glyphs,
    open_notebook,
    run_all,
    save_screenshots,
    saved_notebook,
    shown_outputs,
    shrunk_figures,
    small_text,
)

from course_lib.authoring.gate import unexpected_errors

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts" / "browser"
COURSE_FOLDERS = ("notebooks", "exercises", "solutions")  # served as in the repository
LESSONS = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("notebooks/*.ipynb"))
EXERCISE = "exercises/00_welcome.ipynb"
# Lessons take 20-60 s under nbmake on 2 busy cores; the wait ends as soon as the kernel has
# answered every cell, so this limit only bounds a hung run.
RUN_ALL_TIMEOUT_MS = 600_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"{CHROMIUM} not installed "
                              "(COURSE_BROWSER=1 scripts/install-browser.sh installs it)"),
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One JupyterLab for every notebook, at the root of a copy of the course (its saves
    and autosaves never touch the working tree)."""
    base = tmp_path_factory.mktemp("lab")
    root, home = base / "course", base / "home"
    for folder in COURSE_FOLDERS:
        shutil.copytree(ROOT / folder, root / folder)
    home.mkdir()
    with jupyterlab(root, home) as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                      args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class LabRun(NamedTuple):
    """A notebook as a learner met it: saved after Run All, what the page showed, what could
    not be read (figure text too small, widget labels cut, characters drawn as boxes), and
    how long opening it and Run All took, with the load average before and after."""

    nb: nbformat.NotebookNode
    shown: list[dict]
    too_small: list[str]
    cut: list[str]
    boxes: list[str]
    timing: dict[str, str]


def run_in_lab(lab, browser, path: str) -> LabRun:
    """Open the notebook, Run All, save; screenshots go to
    artifacts/browser/<path without .ipynb>/."""
    shots = ARTIFACTS / path.removesuffix(".ipynb")
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    cells = len(nbformat.read(lab.root / path, as_version=4).cells)
    lab.take_figure_log()  # figures of an earlier notebook are not this one's
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    load_before, start = os.getloadavg(), time.monotonic()
    try:
        open_notebook(page, lab.notebook_url(path), cells)
        opened = time.monotonic()
        run_all(page, RUN_ALL_TIMEOUT_MS)
        ran = time.monotonic()
        timing = {"open_seconds": f"{opened - start:.1f}", "run_all_seconds": f"{ran - opened:.1f}",
                  "load_before": " ".join(f"{x:.1f}" for x in load_before),
                  "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg())}
        print(f"{path}: opened in {timing['open_seconds']} s, Run All "
              f"{timing['run_all_seconds']} s (load average {timing['load_before']} before, "
              f"{timing['load_after']} after)")
        shown = shown_outputs(page)
        nb = saved_notebook(page, lab.root / path)
        save_screenshots(page, shown, nb, shots)
        for note in shrunk_figures(shown):
            print(f"{path}: {note}")
        too_small = small_text(shown, lab.take_figure_log())
        cut, boxes = cut_labels(page, shown), missing_glyphs(page, nb)
    except Exception:
        page.screenshot(path=shots / "failure.png")
        raise
    finally:
        context.close()
        lab.shut_down_kernels()  # its ranks end with it, before the next notebook starts
    return LabRun(nb, shown, too_small, cut, boxes, timing)


@pytest.mark.parametrize("path", LESSONS)
def test_lesson_runs_all_in_jupyterlab(lab, browser, path, request):
    """Also records the Run All time, as a learner meets it, in the JUnit XML file
    (`python -m course_lib run-times --write` reads it from there): the test's
    user_properties, which pytest writes as the test case's <property> elements (what
    record_property does, without its warning that xunit2's schema has no place for them)."""
    run = run_in_lab(lab, browser, path)
    request.node.user_properties.extend(run.timing.items())
    assert unexpected_errors(run.nb) == []
    assert display_problems(run.nb, run.shown) == []
    assert run.too_small == []
    assert run.cut == []
    assert run.boxes == []


def test_exercise_shows_failing_checks_in_jupyterlab(lab, browser):
    run = run_in_lab(lab, browser, EXERCISE)
    assert unexpected_errors(run.nb) == []
    assert display_problems(run.nb, run.shown) == []
    assert failing_check_problems(run.nb, run.shown) == []
    assert run.cut == [] and run.boxes == []


def write_notebook(lab, path: str, cells: list) -> None:
    """A notebook of these cells in the served course, with a lesson's kernelspec."""
    lesson = nbformat.read(lab.root / LESSONS[0], as_version=4)
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata=lesson.metadata),
                   lab.root / path)


LOADED_CELLS = ["import time, matplotlib.pyplot as plt"] + [
    f"time.sleep(0.3)\nprint('cell {i} done')" for i in range(8)] + [
    "fig, ax = plt.subplots(figsize=(6, 2))\nax.plot([0, 1])\n"
    "ax.set_title('a title at 12 pt')\nax.text(0.5, 0.5, 'tiny', fontsize=3)\nplt.show()"]


def test_run_all_waits_for_every_cell_on_a_loaded_machine_and_measures_figure_text(lab,
                                                                                      browser):
    """Run All is finished only when every code cell has run, even while other processes
    keep both cores busy (the kernel can look idle between two cells); and a figure's 3 pt
    text is reported as too small to read."""
    import subprocess
    import sys

    path = "notebooks/zz_loaded.ipynb"
    write_notebook(lab, path, [nbformat.v4.new_code_cell(source) for source in LOADED_CELLS])
    burn = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    try:
        run = run_in_lab(lab, browser, path)
    finally:
        for process in burn:
            process.kill()
            process.wait()
    assert all(cell.execution_count for cell in run.nb.cells)
    assert "cell 7 done" in "".join(o.get("text", "") for o in run.nb.cells[8].outputs)
    assert len(run.too_small) == 1 and "'tiny'" in run.too_small[0]


UNREADABLE_CELLS = [
    nbformat.v4.new_markdown_cell("🔴 **broken**, then ✅ **fixed**; \ue000 has no font"),
    nbformat.v4.new_code_cell(
        "import ipywidgets as w\n"
        "w.VBox([w.IntSlider(description='largest unit (% of model)'),\n"
        "        w.IntSlider(description='world size', style={'description_width': 'initial'}),\n"
        "        w.Checkbox(description='a checkbox whose label is far too long to fit',\n"
        "                   layout=w.Layout(width='200px'))])"),
    nbformat.v4.new_code_cell("print('markers in output: 🔴 ✅')"),
]


def test_cut_widget_labels_and_characters_drawn_as_boxes_are_found(lab, browser):
    """The page check finds what a learner cannot read: a slider's description and a
    checkbox's label cut by ipywidgets, and a character no font has; and not the course's 🔴
    and ✅ markers, which the emoji font (scripts/install-browser.sh) draws."""
    path = "notebooks/zz_unreadable.ipynb"
    write_notebook(lab, path, UNREADABLE_CELLS)
    run = run_in_lab(lab, browser, path)
    assert [line.split(" cut:")[0] for line in run.cut] == [
        "cell 2: widget label 'largest unit (% of model)'",
        "cell 2: widget label 'a checkbox whose label is far too long to fit'"], run.cut
    assert {line.split(" ")[0] for line in run.boxes} == {"'\\ue000'"}, run.boxes
