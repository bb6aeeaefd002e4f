"""How long one x-ray run takes: `python -m course_lib xray` on every case script of
tests/xray_cases/ (as a learner runs it), the median and the slowest (issue 29's target: a
median under 10 s on a 2-core machine).

Run:  .venv/bin/python benchmarks/xray_cases.py [--only SUBSTRING] [--every N]
(all cases: about 8 minutes on a quiet 2-core machine; --every 4 runs every 4th case)
Each run's wall time includes starting Python and torch, launching the ranks, the learner's
script and the report. The machine's load average is printed before and after: on a shared
machine the figures grow with it, so quote them together.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "xray_cases"


def header(path: Path, key: str) -> list[str]:
    """The words of a case's `# key: ...` line (`# xray: --nproc-per-node 3`, the x-ray's
    options; `# args: 2 1`, the script's own), as tests/test_xray_cases.py reads them."""
    for line in path.read_text().splitlines():
        if not line.startswith("# "):
            break
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].split()
    return []


def run(path: Path, folder: str) -> float:
    """Wall seconds of one x-ray of the case, in `folder` (checkpoint cases write there)."""
    command = [sys.executable, "-m", "course_lib", "xray", "--json", "--timeout", "60",
               *header(path, "xray"), str(path), *header(path, "args")]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=folder, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - start
    try:
        json.loads(proc.stdout)  # a report came: the x-ray itself did not break
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"{path.name}: no report\n{proc.stdout}\n{proc.stderr}") from exc
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--every", type=int, default=1, help="run every N-th case only")
    args = parser.parse_args()
    cases = [p for p in sorted(CASES.glob("*.py")) if args.only in p.stem][::args.every]
    load_before = os.getloadavg()
    times: dict[str, float] = {}
    for path in cases:
        with tempfile.TemporaryDirectory() as folder:
            times[path.stem] = run(path, folder)
        print(f"{times[path.stem]:6.1f} s  {path.stem}", flush=True)
    load_after = os.getloadavg()
    slowest = max(times, key=times.get)
    print(f"\n{len(times)} x-ray runs on {os.cpu_count()} cores: median "
          f"{statistics.median(times.values()):.1f} s, slowest {times[slowest]:.1f} s "
          f"({slowest}); load average (1, 5, 15 min) before "
          f"{', '.join(f'{x:.1f}' for x in load_before)}, after "
          f"{', '.join(f'{x:.1f}' for x in load_after)}")


if __name__ == "__main__":
    main()
