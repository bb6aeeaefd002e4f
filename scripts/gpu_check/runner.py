"""Execute notebooks in parallel, each in its own process, and judge each with the gate.

Usage (scripts/gpu-check calls it):
    python scripts/gpu_check/runner.py OUT_DIR JOBS CAP_S NOTEBOOK...
Each notebook is executed in place (pass copies) with nbclient, errors allowed so that every
cell runs, then judged by the gate's own check (`check_executed`). One record per notebook
goes to OUT_DIR/notebooks.json; one line per notebook is printed as it finishes.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nbformat

from course_lib.authoring.gate import check_executed
from course_lib.authoring.outputs import describe_error, error_output
from course_lib.protocol import RAISES, tags

CELL_TIMEOUT_S = 300  # as the gate's default
EXECUTE = """
import sys, nbformat
from nbclient import NotebookClient
path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
try:
    NotebookClient(nb, timeout=int(sys.argv[2]), allow_errors=True, kernel_name="python3",
                   resources={"metadata": {"path": sys.argv[3]}}).execute()
finally:
    nbformat.write(nb, path)
"""


def first_unexpected_error(nb: Any) -> str:
    """'cell N: Name: message' for the first error outside a raises-exception cell, or ''."""
    for number, cell in enumerate(nb.cells, start=1):
        err = error_output(cell)
        if err is not None and RAISES not in tags(cell):
            return f"cell {number}: {describe_error(err)}"
    return ""


def judge(path: Path, seconds: float, stopped: str = "") -> dict[str, Any]:
    """The record of one executed notebook: pass or fail, and why (first reason first)."""
    nb = nbformat.read(path, as_version=4)
    report = check_executed(str(path), nb, [stopped] if stopped else [])
    failed_cells = [f"cell {v.number} {v.what}: saw {v.saw}" for v in report.verdicts if not v.ok]
    first = stopped or first_unexpected_error(nb) or (failed_cells + report.problems + [""])[0]
    return {"notebook": str(path), "ok": report.ok, "seconds": round(seconds, 1),
            "first_error": first, "problems": report.problems, "failed_cells": failed_cells}


def run_one(path: Path, deadline: float) -> dict[str, Any]:
    """Execute one notebook in a child process (killed at the deadline), then judge it."""
    start = time.monotonic()
    left = deadline - start
    if left < 10:
        return not_run(path, "not run: the check's time cap was reached")
    cmd = [sys.executable, "-c", EXECUTE, str(path), str(CELL_TIMEOUT_S), str(path.parent)]
    try:
        done = subprocess.run(cmd, timeout=left, capture_output=True, text=True)
        stopped = "" if done.returncode == 0 else _last_line(done.stderr)
    except subprocess.TimeoutExpired:
        stopped = f"killed: still running when the check's time cap ({left:.0f} s left) ran out"
    return judge(path, time.monotonic() - start, stopped)


def not_run(path: Path, why: str) -> dict[str, Any]:
    """The record of a notebook that was never executed."""
    return {"notebook": str(path), "ok": False, "seconds": 0.0, "first_error": why,
            "problems": [why], "failed_cells": []}


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return f"execution stopped: {lines[-1][:300]}" if lines else "execution stopped"


def run_all(paths: list[Path], out: Path, jobs: int, cap_s: float) -> list[dict[str, Any]]:
    """Run every notebook, `jobs` at a time; print a line as each one ends."""
    deadline = time.monotonic() + cap_s
    records = []
    with cf.ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(run_one, p, deadline) for p in paths]
        for future in cf.as_completed(futures):
            rec = future.result()
            records.append(rec)
            verdict = "PASS" if rec["ok"] else "FAIL"
            print(f"{verdict}  {rec['notebook']}  {rec['seconds']:.0f} s  {rec['first_error']}",
                  flush=True)
    records.sort(key=lambda r: r["notebook"])
    (out / "notebooks.json").write_text(json.dumps(records, indent=1))
    return records


def main(argv: list[str]) -> int:
    """Exit 0 only if every notebook passed."""
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    out, jobs, cap_s = Path(argv[0]), int(argv[1]), float(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    records = run_all([Path(p) for p in argv[3:]], out, jobs, cap_s)
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
