"""The numbers the docs quote about whole runs, each taken from one, with its date and the
machine's load: the test counts and CI time (README), the size of a learner's .venv and the
doctor's table and time (pre-workshop email). Kept in docs/run_facts.json and written into
the pages between marker lines; and each benchmark's latest output (README), which this
command runs itself to record its date and load. Each part can be measured again on its own:

    CI=true bash .ci/run            # writes artifacts/junit.xml and artifacts/ci-seconds
    python -m course_lib run-facts --junit artifacts/junit.xml \\
        --ci-seconds artifacts/ci-seconds [--load artifacts/loadavg]
    LEARNER=/path/to/a/fresh/clone     # after its scripts/setup, without --dev
    $LEARNER/.venv/bin/python -m course_lib run-facts --venv $LEARNER/.venv --doctor
    python -m course_lib run-facts --bench launch --bench xray    # benchmarks/NAME.py

tests/test_run_facts.py fails when a page disagrees with docs/run_facts.json."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from course_lib.authoring.course_map import load_text
from course_lib.authoring.readme_blocks import replace_block
from course_lib.authoring.run_times import read_load

FACTS = Path("docs/run_facts.json")
CI_BLOCK = ("<!-- ci-facts:start -->", "<!-- ci-facts:end -->")
VENV_BLOCK = ("<!-- venv-size:start -->", "<!-- venv-size:end -->")
DOCTOR_BLOCK = ("<!-- doctor:start -->", "<!-- doctor:end -->")
# benchmark (benchmarks/NAME.py) -> how the README shows its output: as printed ("markdown":
# it prints tables) or in a text block; all of it, or its last paragraph (its summary).
BENCHES = {"launch": ("markdown", "all"), "telemetry": ("markdown", "all"),
           "xray": ("text", "all"), "xray_cases": ("text", "last"),
           "widget_stall": ("markdown", "all")}


def bench_markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"


# page -> the blocks it carries
PAGES = {"README.md": (CI_BLOCK, *map(bench_markers, BENCHES)),
         "docs/pre-workshop-email.md": (VENV_BLOCK, DOCTOR_BLOCK)}


def outcome_counts(junit: Path) -> dict[str, int]:
    """Passed, failed, skipped tests and executed notebooks in a JUnit XML file."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "notebooks": 0}
    for case in ET.parse(junit).iter("testcase"):
        outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        counts[outcome] += 1
        counts["notebooks"] += case.get("name", "").endswith(".ipynb")
    return counts


def folder_bytes(path: Path) -> int:
    """Bytes of the files under path (what `du --apparent-size` counts), links not followed."""
    return sum(os.lstat(Path(root) / name).st_size
               for root, _, files in os.walk(path) for name in files)


def run_doctor() -> dict:
    """The doctor on this machine, with this Python: its table (the course folder shortened
    to ~/ddp-course), its wall time and the 1-minute load average before it started."""
    load, start = os.getloadavg()[0], time.monotonic()
    out = subprocess.run([sys.executable, "-m", "course_lib", "doctor"], capture_output=True,
                         text=True, timeout=300)
    python = Path(sys.executable)
    course = python.parents[2] if python.parent.parent.name == ".venv" else Path.cwd()
    return {"date": today(), "seconds": round(time.monotonic() - start, 1),
            "load": f"{load:.1f} at the start",
            "table": out.stdout.strip().replace(str(course), "~/ddp-course")}


def run_bench(name: str) -> dict:
    """Run benchmarks/NAME.py with this Python; its output (or summary), date and load."""
    before = os.getloadavg()[0]
    out = subprocess.run([sys.executable, f"benchmarks/{name}.py"], capture_output=True,
                         text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"benchmarks/{name}.py failed:\n{out.stdout}\n{out.stderr}")
    text = out.stdout.strip()
    if BENCHES[name][1] == "last":
        text = text.split("\n\n")[-1]
    load = f"{before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    return {"date": today(), "load": load, "output": text}


def bench_text(name: str, record: dict) -> str:
    """The README's block for one benchmark run: the command, when, the load, its output."""
    head = (f"`.venv/bin/python benchmarks/{name}.py` on the 2-core development machine on "
            f"{record['date']} ({load_text(record['load'])}):")
    output = record["output"]
    return f"{head}\n\n" + (output if BENCHES[name][0] == "markdown"
                             else f"```text\n{output}\n```")


def today() -> str:
    return datetime.date.today().isoformat()


def blocks(facts: dict) -> dict[tuple[str, str], str]:
    """Each block's text, from the facts."""
    ci, venv, doctor = facts["ci"], facts["venv"], facts["doctor"]
    t = ci["tests"]
    minutes, seconds = divmod(round(ci["seconds"]), 60)
    ci_text = (f"The whole of `.ci/run` took {minutes} min {seconds:02d} s on the 2-core machine "
               f"on {ci['date']} (a clean clone, set-up included; {load_text(ci['load'])}): "
               f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped, of which "
               f"{t['notebooks']} notebooks under nbmake.")
    venv_text = (f"A learner's `.venv` took {venv['bytes'] / 1e9:.1f} GB of disk on "
                 f"{venv['date']} (a fresh one, Linux, torch's CPU build, no test tools).")
    took = (f"This run of the doctor took {doctor['seconds']:.0f} s on the 2-core development "
            f"machine on {doctor['date']} ({load_text(doctor['load'])})." if doctor.get("seconds")
            else f"The doctor's time on {doctor['date']} was not recorded.")
    runs = facts.get("bench", {})
    benches = {bench_markers(name): bench_text(name, runs[name]) if name in runs else
               f"Not measured yet: `python -m course_lib run-facts --bench {name}` runs it."
               for name in BENCHES}
    return {CI_BLOCK: ci_text, VENV_BLOCK: venv_text,
            DOCTOR_BLOCK: f"```\n{doctor['table']}\n```\n\n{took}", **benches}


def render(root: Path, facts: dict) -> dict[str, str]:
    """Each page's text with its blocks written from the facts."""
    texts, written = {}, blocks(facts)
    for page, names in PAGES.items():
        text = (root / page).read_text()
        for name in names:
            text = replace_block(text, written[name], *name)
        texts[page] = text
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib run-facts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--junit", type=Path, help="JUnit XML of a full run (with --ci-seconds)")
    parser.add_argument("--ci-seconds", type=Path,
                        help="a file holding .ci/run's wall time in seconds")
    parser.add_argument("--load", type=Path, metavar="FILE",
                        help="the CI run's load average: lines 'start ...' and 'end ...' "
                             "(default: loadavg beside the JUnit file)")
    parser.add_argument("--venv", type=Path,
                        help="a learner's .venv (made by scripts/setup, without --dev)")
    parser.add_argument("--bench", action="append", choices=BENCHES, default=[],
                        help="run benchmarks/NAME.py and keep its output (several: repeat)")
    parser.add_argument("--doctor", action="store_true",
                        help="run the doctor with this Python (a learner's .venv's) and keep "
                             "its table and time")
    args = parser.parse_args(argv)
    if bool(args.junit) != bool(args.ci_seconds) or not (args.junit or args.venv or args.doctor
                                                          or args.bench):
        parser.error("give --junit with --ci-seconds, and/or --venv, --doctor, --bench NAME")
    measured, benches = {}, {name: run_bench(name) for name in args.bench}
    if args.junit:
        measured["ci"] = {"date": today(),
                          "seconds": float(args.ci_seconds.read_text().split()[0]),
                          "load": read_load(args.load or args.junit.parent / "loadavg"),
                          "tests": outcome_counts(args.junit)}
    if args.venv:
        measured["venv"] = {"date": today(), "bytes": folder_bytes(args.venv)}
    if args.doctor:
        measured["doctor"] = run_doctor()
    facts = json.loads(FACTS.read_text())  # read after the runs: another may have written
    facts.update(measured)
    facts.setdefault("bench", {}).update(benches)
    FACTS.write_text(json.dumps(facts, indent=1) + "\n")
    for page, text in render(Path("."), facts).items():
        Path(page).write_text(text)
    print("\n\n".join(blocks(facts).values()))
    return 0
