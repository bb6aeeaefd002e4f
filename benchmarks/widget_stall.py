"""Do cells with widgets stand still in a headless run? The cause of issue 34's 300 s stalls.

Executes two notebooks of 30 widget cells each with nbclient (what nbmake and the GPU check
use), several at once beside busy loops, with a short cell timeout T:
- "into Output": each cell draws a figure into an ipywidgets Output while it runs (what the
  course's explorers did before);
- "redrawn_below": each cell shows the figure as plain output and returns a slider with
  course_lib.plots.explore.redrawn_below, which draws only when the slider moves.

A cell whose reply was missed waits for its timeout and then goes on, so it takes T s: such
cells are counted as stalled. Run from the repository root:

    .venv/bin/python benchmarks/widget_stall.py [--runs 4] [--at-once 3] [--busy 2] [--timeout 15]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

SETUP = ("import ipywidgets as widgets\nfrom IPython.display import display\n"
         "import matplotlib.pyplot as plt\nfrom course_lib.plots.explore import redrawn_below\n"
         "def figure(k):\n    fig, ax = plt.subplots(figsize=(3, 2))\n"
         "    ax.plot(range(k + 2))\n    plt.close(fig)\n    return fig")
PATTERNS = {
    "into Output": ("slider = widgets.IntSlider(1)\nout = widgets.Output()\nwith out:\n"
                    "    display(figure(slider.value))\nwidgets.VBox([slider, out])"),
    "redrawn_below": ("slider = widgets.IntSlider(1)\ndisplay(figure(slider.value))\n"
                      "widgets.VBox([slider, redrawn_below(lambda: figure(slider.value), "
                      "slider)])"),
}


def run_notebook(path: str, timeout: int) -> list[float]:
    """Execute once; return each widget cell's wall time as the client saw it."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3")
    starts: dict[int, float] = {}
    took: list[float] = []
    client.on_cell_start = lambda cell, cell_index: starts.__setitem__(cell_index,
                                                                       time.monotonic())
    client.on_cell_executed = lambda cell, cell_index, execute_reply: took.append(
        time.monotonic() - starts[cell_index]) if cell_index else None
    client.execute()
    return took


def measure(pattern: str, folder: Path, args: argparse.Namespace) -> dict:
    """`args.at_once` processes each run the pattern's notebook `args.runs` times."""
    path = folder / f"{pattern.split()[0]}.ipynb"
    cells = [new_code_cell(SETUP)] + [new_code_cell(PATTERNS[pattern]) for _ in range(30)]
    nbformat.write(new_notebook(cells=cells), path)
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "from widget_stall import run_notebook\n"
            f"print(json.dumps([run_notebook({str(path)!r}, {args.timeout}) "
            f"for _ in range({args.runs})]))")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
             for _ in range(args.at_once)]
    times = [t for p in procs for run in json.loads(p.communicate()[0]) for t in run]
    stalled = [t for t in times if t >= args.timeout - 1]
    return {"pattern": pattern, "cells": len(times), "stalled": len(stalled),
            "slowest_s": round(max(times), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="runs per process")
    parser.add_argument("--at-once", type=int, default=3, help="processes at once")
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside them")
    parser.add_argument("--timeout", type=int, default=15, help="nbclient's cell timeout, s")
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.busy)]
    try:
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as tmp:
            rows = [measure(p, Path(tmp), args) for p in PATTERNS]
    finally:
        for p in busy:
            p.kill()
    print(f"# widget cells under nbclient: {args.at_once} notebooks at once, {args.busy} busy "
          f"loops, {os.cpu_count()} cores, cell timeout {args.timeout} s, load average "
          f"{load:.1f} -> {os.getloadavg()[0]:.1f}")
    print("| pattern | widget cells | stalled until the timeout | slowest cell |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['pattern']} | {r['cells']} | {r['stalled']} | {r['slowest_s']} s |")


if __name__ == "__main__":
    main()
