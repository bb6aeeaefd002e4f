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


def run_in_lab(lab, browser, path: str) -> tuple[nbformat.NotebookNode, list[dict]]:
    """Open the notebook, Run All, save; return the saved notebook and what the page showed.
    Screenshots go to artifacts/browser/<path without .ipynb>/."""
    shots = ARTIFACTS / path.removesuffix(".ipynb")
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    cells = len(nbformat.read(lab.root / path, as_version=4).cells)
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
    except Exception:
        page.screenshot(path=shots / "failure.png")
        raise
    finally:
        context.close()
        lab.shut_down_kernels()  # its ranks end with it, before the next notebook starts
    return nb, shown


@pytest.mark.parametrize("path", LESSONS)
def test_lesson_runs_all_in_jupyterlab(lab, browser, path):
    nb, shown = run_in_lab(lab, browser, path)
    assert unexpected_errors(nb) == []
    assert display_problems(nb, shown) == []


def test_exercise_shows_failing_checks_in_jupyterlab(lab, browser):
    nb, shown = run_in_lab(lab, browser, EXERCISE)
    assert unexpected_errors(nb) == []
    assert display_problems(nb, shown) == []
    assert failing_check_problems(nb, shown) == []
