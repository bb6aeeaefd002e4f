"""The numbers the docs quote about a whole run, taken from one: the test counts and CI time
(README), the size of a learner's .venv and the doctor's table (pre-workshop email). Kept in
docs/run_facts.json and written into the pages between marker lines.

    CI=true bash .ci/run            # writes artifacts/junit.xml and artifacts/ci-seconds
    python -m course_lib run-facts --junit artifacts/junit.xml \\
        --ci-seconds artifacts/ci-seconds --venv /path/to/a/learners/.venv

tests/test_run_facts.py fails when a page disagrees with docs/run_facts.json."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from course_lib.authoring.readme_blocks import replace_block

FACTS = Path("docs/run_facts.json")
CI_BLOCK = ("<!-- ci-facts:start -->", "<!-- ci-facts:end -->")
VENV_BLOCK = ("<!-- venv-size:start -->", "<!-- venv-size:end -->")
DOCTOR_BLOCK = ("<!-- doctor:start -->", "<!-- doctor:end -->")
# page -> the blocks it carries
PAGES = {"README.md": (CI_BLOCK,), "docs/pre-workshop-email.md": (VENV_BLOCK, DOCTOR_BLOCK)}


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


def doctor_table() -> str:
    """The doctor's table on this machine, paths under the home folder shortened."""
    out = subprocess.run([sys.executable, "-m", "course_lib", "doctor"], capture_output=True,
                         text=True, timeout=300)
    return out.stdout.strip().replace(str(Path.cwd()), "~/ddp-course")


def blocks(facts: dict) -> dict[tuple[str, str], str]:
    """Each block's text, from the facts."""
    t = facts["tests"]
    minutes, seconds = divmod(round(facts["ci_seconds"]), 60)
    ci = (f"The whole of `.ci/run` took {minutes} min {seconds:02d} s on the 2-core machine on "
          f"{facts['date']} (a clean clone, set-up included): {t['passed']} passed, "
          f"{t['failed']} failed, {t['skipped']} skipped, of which {t['notebooks']} notebooks "
          "under nbmake.")
    venv = (f"A learner's `.venv` took {facts['venv_bytes'] / 1e9:.1f} GB of disk on "
            f"{facts['date']} (a fresh one, Linux, torch's CPU build, no test tools).")
    doctor = f"```\n{facts['doctor']}\n```"
    return {CI_BLOCK: ci, VENV_BLOCK: venv, DOCTOR_BLOCK: doctor}


def render(root: Path, facts: dict) -> dict[str, str]:
    """Each page's text with its blocks written from the facts."""
    texts = {}
    for page, names in PAGES.items():
        text = (root / page).read_text()
        for name in names:
            text = replace_block(text, blocks(facts)[name], *name)
        texts[page] = text
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib run-facts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--junit", type=Path, required=True, help="JUnit XML of a full run")
    parser.add_argument("--ci-seconds", type=Path, required=True,
                        help="a file holding .ci/run's wall time in seconds")
    parser.add_argument("--venv", type=Path, required=True,
                        help="a learner's .venv (made by scripts/setup, without --dev)")
    args = parser.parse_args(argv)
    facts = {"date": datetime.date.today().isoformat(),
             "ci_seconds": float(args.ci_seconds.read_text().split()[0]),
             "tests": outcome_counts(args.junit), "venv_bytes": folder_bytes(args.venv),
             "doctor": doctor_table()}
    FACTS.write_text(json.dumps(facts, indent=1) + "\n")
    for page, text in render(Path("."), facts).items():
        Path(page).write_text(text)
    print("\n".join(blocks(facts).values()))
    return 0
