"""JupyterLab and a page in it, as a learner has them: a private JupyterLab server, Run All
from the Run menu, what the page shows (figures, widgets, errors) and screenshots of it.
Used by tests/test_browser.py."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import unicodedata
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import nbformat

from course_lib.authoring.outputs import error_output
from course_lib.protocol import CHECK, CHECK_MIME, EXERCISE, course_meta

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


# --- the server ---------------------------------------------------------------------------

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


# Private user settings: widget state saved with the notebook (so the test can read what
# Output widgets hold); no autosave (the test's own save is the only one it reads back).
SETTINGS = {"@jupyter-widgets/jupyterlab-manager/plugin": {"saveState": True},
            "@jupyterlab/docmanager-extension/plugin": {"autosave": False}}


FIGURE_TEXT_PROBE = Path(__file__).with_name("figure_text_probe.py")
FIGURE_TEXT_LOG = "figure-text.jsonl"  # in the server's home folder


def lab_env(home: Path) -> dict[str, str]:
    """Private config, data, runtime and settings folders; the news pop-up switched off;
    the kernel's environment as a learner's, plus an IPython start-up file that logs each
    inline figure's smallest text (figure_text_probe.py)."""
    startup = home / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-figure-text.py").write_text(FIGURE_TEXT_PROBE.read_text())
    labconfig = home / "config" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    for plugin, values in SETTINGS.items():
        settings = home / "settings" / f"{plugin}.jupyterlab-settings"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps(values))
    # No MPLBACKEND from the caller's shell: a learner's kernel has the inline backend, which
    # puts each figure into the page (with Agg none would be drawn, and none be missed).
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    return {**env, "JUPYTER_CONFIG_DIR": str(home / "config"),
            "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "IPYTHONDIR": str(home / "ipython"),
            "COURSE_FIGURE_TEXT_LOG": str(home / FIGURE_TEXT_LOG)}


class Lab:
    """A running JupyterLab: its URL, token, REST calls on it, and its kernels' figure log."""

    def __init__(self, url: str, token: str, root: Path, home: Path):
        self.url, self.token, self.root = url, token, root
        self.figure_log = home / FIGURE_TEXT_LOG

    def take_figure_log(self) -> list[dict]:
        """The figures logged since the last call (figure_text_probe.py), and a fresh log."""
        if not self.figure_log.exists():
            return []
        entries = [json.loads(line) for line in self.figure_log.read_text().splitlines()]
        self.figure_log.unlink()
        return entries

    def api(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            body = response.read()
        return json.loads(body) if body else None

    def notebook_url(self, path: str) -> str:
        """The notebook in a workspace of its own (nothing restored from an earlier page)."""
        workspace = re.sub(r"[^A-Za-z0-9_-]", "-", path)  # lessons and exercises share names
        return f"{self.url}/lab/workspaces/{workspace}/tree/{path}?token={self.token}"

    def shut_down_kernels(self) -> None:
        """As a learner closing the notebook: its kernel, and the ranks it started, end."""
        for kernel in self.api("kernels"):
            self.api(f"kernels/{kernel['id']}", method="DELETE")


@contextmanager
def jupyterlab(root: Path, home: Path) -> Iterator[Lab]:
    """Serve `root` on a free loopback port."""
    port, token = free_port(), secrets.token_hex(16)
    log = home / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(lab_command(root, port, token, home), env=lab_env(home),
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_server(server, f"http://127.0.0.1:{port}/api/status?token={token}", log)
        yield Lab(f"http://127.0.0.1:{port}", token, root, home)
    finally:
        server.terminate()  # shuts any kernel left (and the ranks it started) down
        server.wait(timeout=30)


def wait_for_server(server: subprocess.Popen, url: str, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"JupyterLab exited:\n{log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"JupyterLab did not answer within {timeout} s:\n"
                       f"{log.read_text()[-2000:]}")


# --- a learner's actions in the page --------------------------------------------------------

KERNEL_IDLE = """() => [...document.querySelectorAll('.jp-StatusBar-TextItem')]
    .some(e => /\\(ipykernel\\) \\| Idle/.test(e.textContent))"""

# The notebook toolbar's execution indicator (the circle a learner sees fill up) turns busy
# when Run All sends its requests and idle once the kernel has answered every one of them,
# executed or aborted after an error. An observer records the busy turn, so a fast run
# cannot slip between two polls.
WATCH_RUN = """() => {
    const run = window.courseRunAll = {busy: false};
    const mark = () => {
        if (document.querySelector('.jp-Notebook-ExecutionIndicator[data-status="busy"]'))
            run.busy = true;
    };
    new MutationObserver(mark).observe(document.body, {subtree: true, childList: true,
        attributes: true, attributeFilter: ['data-status']});
}"""
RUN_FINISHED = """() => window.courseRunAll.busy
    && document.querySelector('.jp-Notebook-ExecutionIndicator').dataset.status === 'idle'"""
# Every code cell shows its execution count ("[12]:", not "[ ]:" or "[*]:"): the indicator
# alone can read idle between two cells while more are queued (seen under load).
ALL_CELLS_RAN = """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')]
    .every(cell => /\\[\\d+\\]/.test(
        (cell.querySelector('.jp-InputArea-prompt') || {}).textContent || ''))"""


def open_notebook(page, url: str, cells: int, timeout_ms: int = 120_000) -> None:
    """Open the notebook; wait for every cell and an idle kernel."""
    page.goto(url)
    page.wait_for_function(
        f"document.querySelectorAll('.jp-Notebook .jp-Cell').length == {cells}",
        timeout=timeout_ms)
    page.wait_for_function(KERNEL_IDLE, timeout=timeout_ms)


def run_all(page, timeout_ms: int, settle_ms: int = 1000) -> None:
    """Run > Run All Cells, as a learner does; wait until every code cell shows its
    execution count and the kernel is idle twice, settle_ms apart."""
    page.evaluate(WATCH_RUN)
    page.locator(".jp-Notebook .jp-Cell").first.click()  # the notebook is the current widget
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator("li[data-command='runmenu:run-all']").click()
    deadline = time.monotonic() + timeout_ms / 1000
    page.wait_for_function(RUN_FINISHED, timeout=timeout_ms, polling=250)
    while time.monotonic() < deadline:
        left_ms = max(1.0, (deadline - time.monotonic()) * 1000)
        page.wait_for_function(ALL_CELLS_RAN, timeout=left_ms, polling=250)
        page.wait_for_function(KERNEL_IDLE, timeout=left_ms)
        page.wait_for_timeout(settle_ms)
        if page.evaluate(KERNEL_IDLE) and page.evaluate(ALL_CELLS_RAN):
            return
    raise TimeoutError(f"Run All did not finish within {timeout_ms / 1000:g} s")


def saved_notebook(page, path: Path, timeout_ms: int = 60_000) -> nbformat.NotebookNode:
    """File > Save from the page, then read back what the browser's kernel produced (once the
    server has answered the save: it writes the file in place)."""
    def is_save(response) -> bool:
        return response.request.method == "PUT" and "/api/contents/" in response.url

    with page.expect_response(is_save, timeout=timeout_ms) as saving:
        page.locator(".jp-NotebookPanel-toolbar [data-command='docmanager:save']").click()
    if not saving.value.ok:
        raise RuntimeError(f"JupyterLab could not save {path.name}: {saving.value.status}")
    return nbformat.read(path, as_version=4)


# --- what the page shows --------------------------------------------------------------------

# Per cell, in notebook order: the figures (and the % of its width each is shown at), widgets
# and text its output area shows. Each figure and widget is marked (data-course-shot) for
# its screenshot.
SHOWN = r"""(widgetClasses) => {
    const repr = new RegExp('\\b(' + widgetClasses.join('|') + ')\\((\\)|\\w+=)');
    const stuck = /Loading widget\.\.\.|Error displaying widget/;
    const loaded = img => img.complete && img.naturalWidth > 0;
    return [...document.querySelectorAll('.jp-Notebook .jp-Cell')].map((cell, i) => {
        const seen = {figures: 0, blankFigures: 0, widgets: 0, widgetFigures: 0,
                      blankWidgetFigures: 0, stuck: [], reprs: [], text: '', shots: [],
                      scales: [], sizes: []};
        const area = cell.querySelector('.jp-Cell-outputArea');
        if (!area) return seen;
        seen.text = area.textContent;
        const mark = (node, kind, k) => {
            const name = `cell${String(i + 1).padStart(2, '0')}-${kind}${k}`;
            node.setAttribute('data-course-shot', name);
            seen.shots.push(name);
        };
        const outputs = area.querySelectorAll(
            ':scope > .jp-OutputArea-child > .jp-OutputArea-output');
        for (const out of outputs) {
            const mime = out.dataset.mimeType || '';
            const view = out.querySelector(':scope > .jupyter-widgets');
            if (stuck.test(out.textContent)) {
                seen.stuck.push(out.textContent.trim().slice(0, 200));
            } else if (mime.startsWith('image/')) {
                const img = out.querySelector('img');
                if (img && loaded(img)) {
                    mark(out, 'figure', ++seen.figures);
                    seen.scales.push(Math.round(100 * img.width / img.naturalWidth));
                    seen.sizes.push([img.naturalWidth, img.naturalHeight, img.width]);
                } else seen.blankFigures += 1;
            } else if (view) {
                mark(view, 'widget', ++seen.widgets);
                for (const img of view.querySelectorAll('img')) {
                    if (loaded(img)) seen.widgetFigures += 1;
                    else seen.blankWidgetFigures += 1;
                }
            } else {
                const found = out.textContent.match(repr);
                if (found) seen.reprs.push(found[0]);
            }
        }
        return seen;
    });
}"""

WIDGETS_SETTLED = """() => ![...document.querySelectorAll('.jp-OutputArea-output')]
    .some(e => e.textContent.trim() === 'Loading widget...')"""


def widget_classes() -> list[str]:
    """The names of ipywidgets' widget classes, whose text repr (`IntSlider(value=3, ...)`)
    a page shows when a widget fails to render."""
    import ipywidgets

    return sorted(name for name, obj in vars(ipywidgets).items()
                  if isinstance(obj, type) and issubclass(obj, ipywidgets.DOMWidget))


def shown_outputs(page, timeout_ms: int = 60_000) -> list[dict]:
    """What each cell's output area shows, once no widget is still loading (a widget still
    loading after timeout_ms is reported as stuck)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(WIDGETS_SETTLED, timeout=timeout_ms)
    except PlaywrightTimeout:
        pass  # a widget still loading is reported as stuck, in its cell
    return page.evaluate(SHOWN, widget_classes())


# --- what the kernel produced, against what the page shows ---------------------------------

def count_outputs(cell: dict, mimes: tuple[str, ...]) -> int:
    """How many of the cell's outputs carry one of these MIME types."""
    return sum(1 for out in cell.get("outputs", []) if any(m in out.get("data", {}) for m in mimes))


def widget_state_figures(nb: dict) -> int:
    """Figures the kernel sent into Output widgets (the saved widget state holds them)."""
    state = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    return sum(count_outputs(model.get("state", {}), IMAGE_TYPES) for model in state.values()
               if model.get("model_name") == "OutputModel")


def display_problems(nb: dict, shown: list[dict]) -> list[str]:
    """Every code cell ran; each figure the kernel drew is an image in the page; each widget
    renders as a widget (not stuck loading, not its text repr)."""
    if len(shown) != len(nb["cells"]):
        return [f"the page shows {len(shown)} cells, the notebook has {len(nb['cells'])}"]
    found = []
    for number, (cell, seen) in enumerate(zip(nb["cells"], shown), start=1):
        if cell["cell_type"] != "code":
            continue
        if cell.get("execution_count") is None:
            found.append(f"cell {number}: did not run")
        figures, widgets = count_outputs(cell, IMAGE_TYPES), count_outputs(cell, (WIDGET_VIEW,))
        if seen["figures"] != figures:
            found.append(f"cell {number}: the kernel drew {figures} figure(s), the page shows "
                         f"{seen['figures']} ({seen['blankFigures']} blank)")
        if seen["widgets"] != widgets:
            found.append(f"cell {number}: the kernel displayed {widgets} widget(s), the page "
                         f"renders {seen['widgets']}")
        found += [f"cell {number}: widget shows {text!r}" for text in seen["stuck"]]
        found += [f"cell {number}: a widget shown as text: {text!r}" for text in seen["reprs"]]
        if seen["blankWidgetFigures"]:
            found.append(f"cell {number}: {seen['blankWidgetFigures']} blank figure(s) in widgets")
    inside = sum(seen["widgetFigures"] for seen in shown)
    if inside != widget_state_figures(nb):
        found.append(f"the kernel drew {widget_state_figures(nb)} figure(s) into widgets, "
                     f"the page shows {inside}")
    return found


def save_screenshots(page, shown: list[dict], nb: dict, folder: Path) -> list[Path]:
    """The screen as it is, then each figure and widget, then each error as the page shows
    them (element screenshots: the notebook panel scrolls, so one screen shows little)."""
    saved = [folder / "page.png"]
    page.screenshot(path=saved[0])
    cells = page.locator(".jp-Notebook .jp-Cell")
    for name in (name for seen in shown for name in seen["shots"]):
        saved.append(folder / f"{name}.png")
        element_screenshot(page, page.locator(f"[data-course-shot='{name}']"), saved[-1])
    for number, cell in enumerate(nb["cells"], start=1):
        if error_output(cell) is not None:
            saved.append(folder / f"cell{number:02d}-error.png")
            error = cells.nth(number - 1).locator(".jp-Cell-outputArea > .jp-OutputArea-child")
            element_screenshot(page, error.last, saved[-1])
    return saved


def element_screenshot(page, element, path: Path) -> None:
    """The element as the notebook panel shows it; one taller than the panel is scrolled to
    its end (where a traceback names the error) and cut at the panel's edges."""
    panel = page.locator(".jp-NotebookPanel .jp-WindowedPanel-outer").bounding_box()
    box = scrolled_into_view(page, element, panel)
    top = max(box["y"], panel["y"])
    bottom = min(box["y"] + box["height"], panel["y"] + panel["height"])
    page.screenshot(path=path, clip={"x": box["x"], "y": top, "width": box["width"],
                                     "height": bottom - top})


def scrolled_into_view(page, element, panel: dict, tries: int = 20) -> dict:
    """Scroll the element into the panel until its place stops moving: cells that come into
    view are laid out only then (content-visibility), which shifts what follows them."""
    block = "end" if element.bounding_box()["height"] > panel["height"] else "center"
    box = None
    for _ in range(tries):
        element.evaluate(f"e => e.scrollIntoView({{block: '{block}'}})")
        page.evaluate("() => new Promise(r => requestAnimationFrame(() => "
                      "requestAnimationFrame(r)))")
        before, box = box, element.bounding_box()
        if box == before:
            break
    return box


def failing_check_problems(nb: dict, shown: list[dict]) -> list[str]:
    """An exercise as handed out: each check cell shows the learner its failure (the stub's
    NotImplementedError or a failed check result), with its message visible in the page."""
    found = []
    for number, (cell, seen) in enumerate(zip(nb["cells"], shown), start=1):
        if course_meta(cell).get(EXERCISE) != CHECK:
            continue
        message = failure_message(cell)
        if message is None:
            found.append(f"cell {number}: the check shows no failure for the untouched stub")
        elif message not in seen["text"]:
            found.append(f"cell {number}: the page does not show the check's {message!r}")
    return found


def failure_message(cell: dict) -> str | None:
    """The first line of what a failing check tells the learner; None if it did not fail."""
    error = error_output(cell)
    if error is not None:
        return opening(str(error.get("evalue", "")))
    results = [out["data"][CHECK_MIME] for out in cell.get("outputs", [])
               if CHECK_MIME in out.get("data", {})]
    failed = [result for result in results if not result.get("passed")]
    return opening(failed[0]["message"]) if failed else None


def opening(text: str, width: int = 60) -> str:
    """The start of the text's first line: enough to find it in the page."""
    lines = text.strip().splitlines()
    return lines[0][:width] if lines else ""


TEXT_FLOOR_PX = 8


def small_text(shown: list[dict], logged: list[dict], floor: float = TEXT_FLOOR_PX) -> list[str]:
    """Figures whose smallest text is shown below `floor` pixels tall: each figure in the
    page is matched, by its pixel size and in order, to the kernel's log of it."""
    pending: dict[tuple[int, int], list[dict]] = {}
    for entry in logged:
        pending.setdefault((entry["width"], entry["height"]), []).append(entry)
    found = []
    for number, seen in enumerate(shown, start=1):
        for natural_w, natural_h, shown_w in seen.get("sizes", []):
            matches = pending.get((natural_w, natural_h))
            if not matches:
                continue  # not drawn by matplotlib's inline backend: not measured
            entry = matches.pop(0)
            px = entry["text_px"] * shown_w / natural_w
            if px < floor:
                found.append(f"cell {number}: text {entry['text']!r} shown {px:.1f} px tall "
                             f"(figure at {round(100 * shown_w / natural_w)}% of its width); "
                             f"at least {floor} px is readable")
    return found


def shrunk_figures(shown: list[dict], below: int = 80) -> list[str]:
    """Figures the page scales down to fit the notebook's width (small text to read)."""
    return [f"cell {number}: figure shown at {scale}% of its width"
            for number, seen in enumerate(shown, start=1) for scale in seen["scales"]
            if scale < below]


# --- what a learner can read: glyphs and labels ----------------------------------------------

# A character no font has (plane 16's private use area): the browser draws it as the font's
# missing-glyph box, the same box for every character it has no font for.
NO_GLYPH = "\U0010fffd"
# Each character drawn in each of the page's fonts (prose, code, output) on a canvas, compared
# pixel for pixel with the missing-glyph box: equal means it reaches the learner as a box.
MISSING_GLYPHS = r"""([chars, noGlyph]) => {
    const fonts = new Set();
    for (const selector of ['.jp-RenderedMarkdown', '.jp-Notebook .cm-content',
                            '.jp-OutputArea-output pre', '.jp-OutputArea-output']) {
        const element = document.querySelector(selector);
        if (element) fonts.add(getComputedStyle(element).fontFamily);
    }
    const canvas = document.createElement('canvas');
    canvas.width = canvas.height = 64;
    const ctx = canvas.getContext('2d', {willReadFrequently: true});
    const draw = (ch, family) => {
        ctx.clearRect(0, 0, 64, 64);
        ctx.font = `32px ${family}`;
        ctx.textBaseline = 'top';
        ctx.fillText(ch, 4, 4);
        return ctx.getImageData(0, 0, 64, 64).data.join(',');
    };
    const missing = [];
    for (const family of fonts) {
        const box = draw(noGlyph, family);
        for (const ch of chars) if (draw(ch, family) === box) missing.push([ch, family]);
    }
    return missing;
}"""
# Control characters, spaces and marks draw nothing on their own: not checked.
DRAWS_NOTHING = {"Cc", "Cf", "Mn", "Mc", "Me", "Zs", "Zl", "Zp"}
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def notebook_text(nb: dict) -> str:
    """Every cell's source and every text its outputs carry (tracebacks without colours)."""
    parts = []
    for cell in nb["cells"]:
        parts.append(cell["source"])
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts += out.get("traceback", [])
            parts += [str(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
    return ANSI.sub("", "\n".join(parts))


def symbols(text: str) -> list[str]:
    """The characters outside ASCII that a font must draw, each once."""
    return sorted({ch for ch in text if ord(ch) > 127
                   and unicodedata.category(ch) not in DRAWS_NOTHING})


def missing_glyphs(page, nb: dict) -> list[str]:
    """The notebook's characters that the page's fonts draw as a missing-glyph box (🔴 and ✅
    without an emoji font)."""
    found = page.evaluate(MISSING_GLYPHS, [symbols(notebook_text(nb)), NO_GLYPH])
    return [f"{ch!r} (U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')}) is drawn as a box "
            f"in the font {family}" for ch, family in found]


# Text that ipywidgets cuts with an ellipsis (descriptions, checkbox and button labels) or
# clips (a slider's readout), where it needs more width than it is given.
CUT_TEXT = """widget => [...widget.querySelectorAll('*')].filter(e => {
    const style = getComputedStyle(e);
    const cuts = style.textOverflow === 'ellipsis' || e.classList.contains('widget-readout');
    return cuts && e.offsetParent && e.textContent.trim() && e.scrollWidth > e.clientWidth + 1;
}).map(e => [e.textContent.trim(), e.clientWidth, e.scrollWidth])"""


def cut_labels(page, shown: list[dict]) -> list[str]:
    """Widget labels shown cut off, each widget scrolled into view first (the notebook lays
    out only the cells in view)."""
    panel = page.locator(".jp-NotebookPanel .jp-WindowedPanel-outer").bounding_box()
    found = []
    for number, seen in enumerate(shown, start=1):
        for name in (n for n in seen["shots"] if "-widget" in n):
            widget = page.locator(f"[data-course-shot='{name}']")
            scrolled_into_view(page, widget, panel)
            found += [f"cell {number}: widget label {text!r} cut: shown in {shown_px} px, "
                      f"needs {needed_px} px" for text, shown_px, needed_px
                      in widget.evaluate(CUT_TEXT)]
    return found
