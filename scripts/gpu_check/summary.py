"""Write the GPU check's summary (Markdown, for docs/gpu-check.md) from what the run wrote.

Usage (scripts/gpu-check calls it):  python scripts/gpu_check/summary.py OUT_DIR SECONDS
Reads OUT_DIR/env.json, notebooks.json and pytest.txt; writes OUT_DIR/summary.md; prints it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


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
    """(passed, pytest's closing line) from the quick tests' output; rc=N is our last line."""
    if text.startswith("not run"):
        return False, "not run"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    rc = next((line for line in reversed(lines) if line.startswith("rc=")), "rc=missing")
    closing = next((line.strip("= ") for line in reversed(lines)
                    if " in " in line and ("passed" in line or "failed" in line
                                            or "error" in line)), "no pytest summary line")
    return rc == "rc=0", closing


def render(env: dict[str, Any], records: list[dict[str, Any]], pytest_text: str,
           seconds: float, doctor: str = "not run") -> str:
    """The whole summary; its first line says whether everything passed."""
    failed = [r for r in records if not r["ok"]]
    tests_ok, tests_line = pytest_outcome(pytest_text)
    everything = not failed and tests_ok and bool(records)
    tests_word = "pass" if tests_ok else "not run" if tests_line == "not run" else "FAIL"
    lines = [
        "# GPU check",
        "",
        f"**{'PASS' if everything else 'FAIL'}**: {len(records) - len(failed)} of "
        f"{len(records)} notebooks pass (executed, then judged by the gate); quick tests: "
        f"{tests_word} ({tests_line}). Whole check: {seconds:.0f} s.",
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
    for r in failed:
        more = r["failed_cells"] + [p for p in r["problems"] if p != r["first_error"]]
        if more:
            lines += ["", f"{short(r['notebook'])}:", *(f"- {m}" for m in more[:10])]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Write OUT_DIR/summary.md and print it; exit 0 only if everything passed."""
    out, seconds = Path(argv[0]), float(argv[1])
    env = json.loads((out / "env.json").read_text())
    records = json.loads((out / "notebooks.json").read_text())
    pytest_file = out / "pytest.txt"
    doctor_file = out / "doctor.txt"
    doctor = doctor_file.read_text().strip().splitlines()[-1] if doctor_file.exists() else ""
    tests = pytest_file.read_text() if pytest_file.exists() else "not run\nrc=not run"
    text = render(env, records, tests, seconds, doctor or "not run")
    (out / "summary.md").write_text(text)
    print(text)
    return 0 if text.startswith("# GPU check\n\n**PASS**") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
