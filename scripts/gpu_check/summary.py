"""Write the GPU check's summary (Markdown, for docs/gpu-check.md) from what the run wrote.

Usage (scripts/gpu-check calls it):  python -m gpu_check.summary OUT_DIR SECONDS
Reads OUT_DIR/env.json, notebooks.json, pytest.txt and the stacks files that notebooks.json
names; writes OUT_DIR/summary.md; prints it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from gpu_check import nbwatch  # scripts/ on sys.path: scripts/gpu-check puts it there

CLOSING = re.compile(r"^=*\s*(\d+ (passed|failed|errors?)\b.* in [\d.]+s\b.*?)=*$")
DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)$")


def notebook_table(records: list[dict[str, Any]]) -> list[str]:
    """One row per notebook: pass or fail, time, the first unexpected error."""
    rows = ["| notebook | result | time | first unexpected error (cells counted from 1) |",
            "|---|---|---|---|"]
    for r in records:
        error = r["first_error"].replace("|", "\\|").replace("\n", " ")[:160] or "-"
        rows.append(f"| {short(r['notebook'])} | {'pass' if r['ok'] else 'FAIL'} | "
                    f"{r['seconds']:.0f} s | {error} |")
    return rows


def short(path: str) -> str:
    """A notebook's path from the project root (the copies live under OUT/executed/)."""
    return path.split("/executed/", 1)[-1]


def pytest_outcome(text: str) -> tuple[bool, str]:
    """(passed, what happened) from the quick tests' output; rc=N is our last line."""
    if text.startswith("not run"):
        return False, "not run"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    ended = re.search(r"(rc=\S+)\s*$", text)  # pytest killed mid-line leaves it on its line
    rc = ended.group(1) if ended else "rc=missing"
    closing = next((m.group(1).strip() for line in reversed(lines)
                    if (m := CLOSING.match(line))), "")
    if rc == "rc=124":
        progress = next((m.group(1) for line in reversed(lines)
                         if (m := re.search(r"\[\s*(\d+%)\]$", line))), "?")
        return False, f"killed at their time limit, {progress} done"
    return rc == "rc=0", closing or f"no pytest summary line ({rc})"


def slowest_tests(text: str) -> list[str]:
    """pytest's --durations lines, as 'SECONDS s  TEST (PHASE)'."""
    found = [DURATION.match(line.strip()) for line in text.splitlines()]
    return [f"{float(m.group(1)):.1f} s  {m.group(3)} ({m.group(2)})" for m in found if m]


def stopped_notebooks(records: list[dict[str, Any]], out: Path) -> list[str]:
    """For each notebook killed or stalled: where it waited, and its processes' stacks."""
    lines = []
    for r in records:
        if not r.get("stacks"):
            continue
        stacks = Path(r["stacks"])
        waits = ", ".join(f"cell {s['cell']}: {s['idle']:.0f} s" for s in r.get("stalls", []))
        lines += ["", f"### {short(r['notebook'])}", "",
                  f"- {r['first_error'] or 'passed'}",
                  f"- no progress (no cell started, ended or printed) for: {waits or '-'}",
                  f"- every dump, in full: `{relative(stacks, out)}`; the last one, main "
                  "threads only, innermost frame first:", "", "```",
                  nbwatch.main_threads(stacks.read_text(errors="replace")), "```"]
    return (["", "## Notebooks that stalled or were killed"] + lines) if lines else []


def relative(path: Path, out: Path) -> str:
    """`path` from the results folder, where it lies inside it."""
    try:
        return str(path.resolve().relative_to(out.resolve()))
    except ValueError:
        return str(path)


def doctor_verdict(text: str) -> str:
    """'FAILED: x (rc=1)' or 'All checks passed: ... (rc=0)' from the doctor's report."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    rc = lines[-1] if lines and lines[-1].startswith("rc=") else "rc=?"
    verdict = next((line for line in reversed(lines)
                    if line.startswith(("FAILED", "All checks"))), "no verdict line")
    return f"{verdict} ({rc})"


def render(env: dict[str, Any], records: list[dict[str, Any]], pytest_text: str,
           seconds: float, doctor: str = "not run", out: Path = Path(".")) -> str:
    """The whole summary; its first line says whether everything passed."""
    failed = [r for r in records if not r["ok"]]
    tests_ok, tests_line = pytest_outcome(pytest_text)
    everything = not failed and tests_ok and bool(records)
    tests_part = ("not run (--no-tests)" if tests_line == "not run"
                  else f"{'pass' if tests_ok else 'FAIL'} ({tests_line})")
    lines = [
        "# GPU check",
        "",
        f"**{'PASS' if everything else 'FAIL'}**: {len(records) - len(failed)} of "
        f"{len(records)} notebooks pass (executed, then judged by the gate); quick tests: "
        f"{tests_part}. Whole check: {seconds:.0f} s.",
        "",
        f"- date (UTC): {env.get('date', '?')}",
        f"- command: `{env.get('command', 'scripts/gpu-check')}`, "
        f"commit {env.get('commit', '?')}",
        f"- torch {env.get('torch', '?')} (CUDA {env.get('cuda', '?')}), "
        f"Python {env.get('python', '?')}",
        f"- GPUs seen by torch: {env.get('gpu_count', '?')}: {env.get('gpus', '?')}",
        f"- CPU cores: {env.get('cores', '?')}",
        f"- doctor (its report: doctor.txt in the results folder): {doctor}",
        "",
        *notebook_table(records),
    ]
    slowest = slowest_tests(pytest_text)
    if slowest:
        lines += ["", "The 10 slowest quick tests (pytest --durations=10):", "",
                  *(f"- {line}" for line in slowest)]
    for r in failed:
        more = r["failed_cells"] + [p for p in r["problems"] if p != r["first_error"]]
        if more:
            lines += ["", f"{short(r['notebook'])}:", *(f"- {m}" for m in more[:10])]
    lines += stopped_notebooks(records, out)
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Write OUT_DIR/summary.md and print it; exit 0 only if everything passed."""
    out, seconds = Path(argv[0]), float(argv[1])
    env = json.loads((out / "env.json").read_text())
    records = json.loads((out / "notebooks.json").read_text())
    pytest_file = out / "pytest.txt"
    doctor_file = out / "doctor.txt"
    doctor = doctor_verdict(doctor_file.read_text()) if doctor_file.exists() else ""
    tests = pytest_file.read_text() if pytest_file.exists() else "not run\nrc=not run"
    text = render(env, records, tests, seconds, doctor or "not run", out)
    (out / "summary.md").write_text(text)
    print(text)
    return 0 if text.startswith("# GPU check\n\n**PASS**") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
