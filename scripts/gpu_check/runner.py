"""Execute notebooks in parallel, each in its own process, and judge each with the gate.

Usage (scripts/gpu-check calls it, with scripts/ on PYTHONPATH):
    python -m gpu_check.runner OUT_DIR JOBS CAP_S STALL_S NOTEBOOK...
Each notebook is executed in place (pass copies) by nbwatch.py, errors allowed so that every
cell runs: saved after every cell, killed at the cap with the cell it was in named, stacks
dumped after STALL_S seconds without progress. Then the gate's own check (`check_executed`)
judges it. One record per notebook goes to OUT_DIR/notebooks.json; one line per notebook is
printed as it finishes.
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

from course_lib.authoring.course_map import run_times
from course_lib.authoring.gate import check_executed
from course_lib.authoring.outputs import describe_error, error_output
from course_lib.protocol import RAISES, tags
from gpu_check import nbwatch  # scripts/ on sys.path: scripts/gpu-check puts it there

CELL_TIMEOUT_S = 300  # as the gate's default
NBWATCH = Path(__file__).with_name("nbwatch.py")
ROOT = Path(__file__).resolve().parents[2]


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


def run_one(path: Path, deadline: float, stall_s: float = 60.0) -> dict[str, Any]:
    """Execute one notebook under nbwatch (killed at the deadline, stacks dumped when it
    stalls or is killed), then judge what it saved."""
    start = time.monotonic()
    left = deadline - start
    if left < 10:
        return not_run(path, "not run: the check's time cap was reached")
    cmd = [sys.executable, str(NBWATCH), str(path), "--cap", f"{left:.0f}",
           "--stall", str(stall_s), "--timeout", str(CELL_TIMEOUT_S)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=left + 90)  # nbwatch ends itself at its cap
    except subprocess.TimeoutExpired:
        nbwatch.kill_tree(proc.pid)
        _, stderr = proc.communicate()
    stopped = stop_reason(path, proc.returncode, stderr)
    record = judge(path, time.monotonic() - start, stopped)
    events = nbwatch.read_events(nbwatch.events_path(path))
    record["stalls"] = [{"cell": e["cell"], "idle": e["idle"]} for e in events
                        if e["event"] == "stall"]
    stacks = nbwatch.stacks_path(path)
    record["stacks"] = str(stacks) if stacks.exists() else ""
    return record


def stop_reason(path: Path, returncode: int, stderr: str) -> str:
    """Why a run ended early, naming the cell it was in; '' when every cell ran."""
    if returncode == 0:
        return ""
    if returncode == nbwatch.KILLED:
        return nbwatch.describe_kill(path, "the check's time cap")
    events = nbwatch.read_events(nbwatch.events_path(path))
    finished = next((e for e in events if e["event"] == "finished"), None)
    cell = nbwatch.running_cell(events)
    where = f" in cell {cell['cell']}" if cell else ""
    if finished:
        return f"execution stopped{where}: {finished['detail'][:300]}"
    return f"execution stopped{where} (exit status {returncode}): {_last_line(stderr)}"


def not_run(path: Path, why: str) -> dict[str, Any]:
    """The record of a notebook that was never executed."""
    return {"notebook": str(path), "ok": False, "seconds": 0.0, "first_error": why,
            "problems": [why], "failed_cells": [], "stalls": [], "stacks": ""}


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


def longest_first(paths: list[Path]) -> list[Path]:
    """The notebooks in the order to start them: longest first by docs/run_times.json (CI's
    last nbmake times), so that the slowest does not start last and hold the check up."""
    known = run_times(ROOT)["nbmake"]["seconds"]
    return sorted(paths, key=lambda p: -known.get(short_name(p), 0.0))


def short_name(path: Path) -> str:
    """'notebooks/14_torchrun.ipynb' for a copy at OUT/executed/notebooks/14_torchrun.ipynb."""
    return f"{path.parent.name}/{path.name}"


def run_all(paths: list[Path], out: Path, jobs: int, cap_s: float,
            stall_s: float = 60.0) -> list[dict[str, Any]]:
    """Run every notebook, `jobs` at a time, longest first; print a line as each one ends."""
    deadline = time.monotonic() + cap_s
    records = []
    with cf.ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(run_one, p, deadline, stall_s) for p in longest_first(paths)]
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
    if len(argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    out, jobs, cap_s, stall_s = Path(argv[0]), int(argv[1]), float(argv[2]), float(argv[3])
    out.mkdir(parents=True, exist_ok=True)
    records = run_all([Path(p) for p in argv[4:]], out, jobs, cap_s, stall_s)
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
