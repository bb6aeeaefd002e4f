"""A learner's view: lesson 00 in a real JupyterLab in a real browser (Debian's chromium,
driven by Playwright). Run All must finish, ipywidgets must render, and errors may appear
only in cells tagged raises-exception. Install with scripts/install-browser.sh."""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest

from course_lib.authoring.gate import unexpected_errors

ROOT = Path(__file__).resolve().parents[1]
LESSON = "00_welcome.ipynb"
SCREENSHOT = ROOT / "artifacts" / "browser" / "lesson00.png"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
RUN_ALL_TIMEOUT_MS = 120_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"{CHROMIUM} not installed "
                              "(COURSE_BROWSER=1 scripts/install-browser.sh installs it)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lab_command(root: Path, port: int, token: str, home: Path) -> list[str]:
    return [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
            f"--LabApp.user_settings_dir={home / 'settings'}",
            f"--LabApp.workspaces_dir={home / 'workspaces'}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]


def lab_env(home: Path) -> dict[str, str]:
    """Private config, data and runtime folders; the news pop-up switched off."""
    labconfig = home / "config" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    return {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"),
            "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_RUNTIME_DIR": str(home / "runtime")}


@contextmanager
def jupyterlab(root: Path, home: Path):
    """Serve `root` on a free loopback port; yield the URL prefix with its token."""
    port, token = free_port(), secrets.token_hex(16)
    log = home / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(lab_command(root, port, token, home), env=lab_env(home),
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_server(server, f"http://127.0.0.1:{port}/api/status?token={token}", log)
        yield f"http://127.0.0.1:{port}", token
    finally:
        server.terminate()  # shuts the kernel (and the ranks it started) down
        server.wait(timeout=20)


def wait_for_server(server: subprocess.Popen, url: str, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, f"JupyterLab exited:\n{log.read_text()[-2000:]}"
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"JupyterLab did not answer within {timeout} s:\n{log.read_text()[-2000:]}")


def run_all_cells(page, cells: int) -> None:
    """Wait for every cell and an idle kernel, then Run > Run All Cells, then wait until
    every code cell has run."""
    page.wait_for_function(f"document.querySelectorAll('.jp-Notebook .jp-Cell').length == {cells}",
                           timeout=60_000)
    page.wait_for_function("""() => [...document.querySelectorAll('.jp-StatusBar-TextItem')]
        .some(e => /\\(ipykernel\\) \\| Idle/.test(e.textContent))""", timeout=60_000)
    page.locator(".jp-Notebook .jp-Cell").first.click()  # the notebook is the current widget
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator("li[data-command='runmenu:run-all']").click()
    page.wait_for_function("""() => {
        const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
        return prompts.length > 0 && prompts.every(p => /^\\[\\d+\\]:$/.test(p.textContent.trim()));
    }""", timeout=RUN_ALL_TIMEOUT_MS)


def scroll_to(page, element, tries: int = 5) -> None:
    """Centre the element; repeat, as cells rendered on the way change the layout."""
    height = page.viewport_size["height"]
    for _ in range(tries):
        element.evaluate("e => e.scrollIntoView({block: 'center'})")
        page.wait_for_timeout(200)
        box = element.bounding_box()
        if box and box["y"] >= 0 and box["y"] + box["height"] <= height:
            return


def saved_notebook(page, path: Path, timeout: float = 15):
    """Save from the browser, then read back what the browser's kernel produced."""
    page.locator(".jp-NotebookPanel-toolbar [data-command='docmanager:save']").click()
    deadline = time.monotonic() + timeout
    while True:
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        if all(c.execution_count is not None for c in code) or time.monotonic() > deadline:
            return nb
        time.sleep(0.2)


def test_lesson00_runs_in_jupyterlab_with_widgets(tmp_path):
    from playwright.sync_api import sync_playwright

    root, home = tmp_path / "course", tmp_path / "home"
    shutil.copytree(ROOT / "notebooks", root)
    home.mkdir()
    cells = len(nbformat.read(root / LESSON, as_version=4).cells)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    with jupyterlab(root, home) as (url, token), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        try:
            page.goto(f"{url}/lab/tree/{LESSON}?token={token}")
            run_all_cells(page, cells)
            widget = page.locator(".jp-OutputArea-output .jupyter-widgets.widget-slider").first
            widget.wait_for(state="visible", timeout=15_000)
            assert page.get_by_text("Error displaying widget").count() == 0
            scroll_to(page, widget)
            page.screenshot(path=str(SCREENSHOT))
            nb = saved_notebook(page, root / LESSON)
        except Exception:
            page.screenshot(path=str(SCREENSHOT.with_name("lesson00-failure.png")))
            raise
        finally:
            browser.close()
    assert all(c.execution_count is not None for c in nb.cells if c.cell_type == "code")
    assert unexpected_errors(nb) == []
