"""No cell waits for nothing, on a loaded machine (issue 34).

The stalls of about 300 s came from headless runs (nbclient) of cells that drew into an
ipywidgets Output while they ran: the client then missed the cell's reply until its timeout
(course_lib.plots.explore.redrawn_below has the mechanism; benchmarks/widget_stall.py counts
it). These tests run real kernels: the first checks what the gate reads to catch the pattern,
the second runs the widget lessons at once beside busy loops and fails on any wait that is not
the kernel's own work (a slow cell on a loaded machine is not a stall; a client waiting for a
reply the kernel sent long ago is). nbwatch dumps every process's stacks after 60 s without
progress, for a person to read.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from course_lib.authoring.gate import output_widgets_written

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from gpu_check.nbwatch import cell_spans, events_path, read_events  # noqa: E402

pytestmark = pytest.mark.kernel

# The lessons whose cells make widgets (explorers, sliders), run together.
WIDGET_LESSONS = ["00_welcome", "05_batchnorm_and_buffers", "07_gradient_accumulation",
                  "09_mixed_precision"]
MAX_WAIT_S = 30  # issue 34: "no gap between cells over 30 s"
SETUP = "import ipywidgets as widgets\nfrom IPython.display import display"


def execute(cells: list[str], path: Path) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    nb = new_notebook(cells=[new_code_cell(SETUP), *map(new_code_cell, cells)])
    NotebookClient(nb, timeout=60, kernel_name="python3").execute()
    nbformat.write(nb, path)
    return nb


def test_the_gate_names_output_widgets_written_while_a_notebook_runs(tmp_path):
    drawn_in = execute(["out = widgets.Output()\nwith out:\n    print('first view')\nout"],
                       tmp_path / "bad.ipynb")
    redrawn = execute(["from course_lib.plots.explore import redrawn_below\n"
                       "s = widgets.IntSlider(1)\nprint('first view')\n"
                       "widgets.VBox([s, redrawn_below(lambda: s.value, s)])"],
                      tmp_path / "good.ipynb")
    assert "1 Output widget(s) received output" in " ".join(output_widgets_written(drawn_in))
    assert output_widgets_written(redrawn) == []


def kernel_seconds(cell: nbformat.NotebookNode) -> tuple[datetime, datetime] | None:
    """When the kernel began and answered the cell (its own message dates)."""
    timing = cell.metadata.get("execution", {})
    if "iopub.execute_input" not in timing or "shell.execute_reply" not in timing:
        return None
    return tuple(datetime.fromisoformat(timing[k].replace("Z", "+00:00"))
                 for k in ("iopub.execute_input", "shell.execute_reply"))


def waits(executed: Path) -> list[str]:
    """Cells whose client waited over MAX_WAIT_S beyond the kernel's own work, and gaps
    over MAX_WAIT_S between the kernel's reply to one cell and its start of the next."""
    nb = nbformat.read(executed, as_version=4)
    found, previous_reply = [], None
    for number, start, end in cell_spans(read_events(events_path(executed))):
        kernel = kernel_seconds(nb.cells[number - 1])
        if kernel is None or end is None:
            found.append(f"cell {number}: no reply recorded")
            continue
        beyond = (end - start) - (kernel[1] - kernel[0]).total_seconds()
        if beyond > MAX_WAIT_S:
            found.append(f"cell {number}: the client waited {beyond:.0f} s after the kernel")
        if previous_reply and (kernel[0] - previous_reply).total_seconds() > MAX_WAIT_S:
            found.append(f"cell {number}: started {(kernel[0] - previous_reply).seconds} s "
                         "after the previous reply")
        previous_reply = kernel[1]
    return found


def test_widget_lessons_run_at_once_on_a_loaded_machine_without_a_wait(tmp_path):
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        runs = [subprocess.Popen([sys.executable, str(ROOT / "scripts/gpu_check/nbwatch.py"),
                                  str(tmp_path / "notebooks" / f"{name}.ipynb"),
                                  "--stall", "60", "--timeout", "300"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for name in WIDGET_LESSONS]
        codes = [run.wait(timeout=1200) for run in runs]
    finally:
        for p in busy:
            p.kill()
    problems = {}
    for name, code in zip(WIDGET_LESSONS, codes):
        executed = tmp_path / "notebooks" / f"{name}.ipynb"
        found = waits(executed) + output_widgets_written(nbformat.read(executed, as_version=4))
        if code != 0 or found:
            problems[name] = [f"nbwatch exit {code}", *found]
    assert not problems, "\n".join(f"{name}: {'; '.join(found)}"
                                    for name, found in problems.items())
