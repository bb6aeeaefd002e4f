"""A learner's view: every lesson, and one exercise as handed out, in a real JupyterLab in a
real browser (Debian's chromium, driven by Playwright), one server for them all. Run > Run
All Cells must run every code cell; errors may appear only in cells tagged raises-exception;
every figure the kernel draws must be an image in the page and every widget a widget. The
screenshots land in artifacts/browser/<folder>/<notebook>/. Install with
scripts/install-browser.sh (COURSE_BROWSER=1)."""

import shutil
import time
from pathlib import Path

import nbformat
import pytest
from browser_lab import (
    CHROMIUM,
    CHROMIUM_ARGS,
    display_problems,
    failing_check_problems,
    jupyterlab,
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


def run_in_lab(lab, browser, path: str) -> tuple[nbformat.NotebookNode, list[dict], list[str]]:
    """Open the notebook, Run All, save; return the saved notebook, what the page showed,
    and the figures whose text is shown too small to read. Screenshots go to
    artifacts/browser/<path without .ipynb>/."""
    shots = ARTIFACTS / path.removesuffix(".ipynb")
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    cells = len(nbformat.read(lab.root / path, as_version=4).cells)
    lab.take_figure_log()  # figures of an earlier notebook are not this one's
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    start = time.monotonic()
    try:
        open_notebook(page, lab.notebook_url(path), cells)
        run_all(page, RUN_ALL_TIMEOUT_MS)
        print(f"{path}: Run All finished {time.monotonic() - start:.0f} s after opening")
        shown = shown_outputs(page)
        nb = saved_notebook(page, lab.root / path)
        save_screenshots(page, shown, nb, shots)
        for note in shrunk_figures(shown):
            print(f"{path}: {note}")
        too_small = small_text(shown, lab.take_figure_log())
    except Exception:
        page.screenshot(path=shots / "failure.png")
        raise
    finally:
        context.close()
        lab.shut_down_kernels()  # its ranks end with it, before the next notebook starts
    return nb, shown, too_small


@pytest.mark.parametrize("path", LESSONS)
def test_lesson_runs_all_in_jupyterlab(lab, browser, path):
    nb, shown, too_small = run_in_lab(lab, browser, path)
    assert unexpected_errors(nb) == []
    assert display_problems(nb, shown) == []
    assert too_small == []


def test_exercise_shows_failing_checks_in_jupyterlab(lab, browser):
    nb, shown, _ = run_in_lab(lab, browser, EXERCISE)
    assert unexpected_errors(nb) == []
    assert display_problems(nb, shown) == []
    assert failing_check_problems(nb, shown) == []


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
    cells = [nbformat.v4.new_code_cell(source) for source in LOADED_CELLS]
    lesson = nbformat.read(lab.root / LESSONS[0], as_version=4)  # its kernelspec
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata=lesson.metadata),
                   lab.root / path)
    burn = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    try:
        nb, shown, too_small = run_in_lab(lab, browser, path)
    finally:
        for process in burn:
            process.kill()
            process.wait()
    assert all(cell.execution_count for cell in nb.cells)
    assert "cell 7 done" in "".join(o.get("text", "") for o in nb.cells[8].outputs)
    assert len(too_small) == 1 and "'tiny'" in too_small[0]
