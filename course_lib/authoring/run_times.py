"""How long each notebook takes, as measured in a test run, from its JUnit XML: every
notebook under nbmake (no browser), and each lesson's Run All in JupyterLab as the browser
check met it (tests/test_browser.py records it). Kept in docs/run_times.json with the run's
date and load average, written into a README table, each lesson's opening line "Run time:
...", the course map and the instructor guide.

    CI=true bash .ci/run            # artifacts/junit.xml (and artifacts/loadavg, if written)
    python -m course_lib run-times --write artifacts/junit.xml
    python -m course_lib run-times --browser browser.xml    # a browser check of some lessons

A test (tests/test_run_times.py) fails when these disagree or a notebook is missing."""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat

from course_lib.authoring import course_map
from course_lib.authoring.course_map import load_text
from course_lib.authoring.readme_blocks import replace_block

FOLDERS = ("notebooks", "solutions", "exercises")
TIMES = course_map.TIMES  # one file, which the course map reads too
START, END = "<!-- run-times:start -->", "<!-- run-times:end -->"
# The lesson's opening cell states its time on a line of its own, e.g.
# "**Run time:** about 40 s on a 2-core laptop (measured in CI, see README)."
LINE = re.compile(r"^\*\*Run time:\*\*.*$", re.MULTILINE)
BROWSER_TEST = re.compile(r"^test_lesson_runs_all_in_jupyterlab\[(notebooks/.+\.ipynb)\]$")


def from_junit(path: Path) -> dict[str, float]:
    """'folder/name.ipynb' -> seconds, for every notebook test case in a JUnit XML file."""
    times = {}
    for case in ET.parse(path).iter("testcase"):
        name = case.get("name", "")
        if name.endswith(".ipynb"):
            folder = case.get("classname", "").removesuffix(f".{name}").rsplit(".", 1)[-1]
            times[f"{folder}/{name}"] = round(float(case.get("time", 0)), 1)
    return times


def browser_from_junit(path: Path, date: str) -> dict[str, dict]:
    """'notebooks/name.ipynb' -> its Run All and opening seconds in JupyterLab and the load
    average around them, for each lesson whose browser check passed in the JUnit XML file."""
    found = {}
    for case in ET.parse(path).iter("testcase"):
        lesson = BROWSER_TEST.match(case.get("name", ""))
        if lesson is None or any(case.find(t) is not None for t in ("failure", "error",
                                                                    "skipped")):
            continue
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        if "run_all_seconds" in props:
            found[lesson[1]] = {
                "run_all": float(props["run_all_seconds"]),
                "open": float(props["open_seconds"]), "date": date,
                "load": f"{props['load_before'].split()[0]} before, "
                        f"{props['load_after'].split()[0]} after"}
    return found


def run_date(path: Path) -> str:
    """The day the run started (its test suite's timestamp), else today."""
    stamp = next((s.get("timestamp") for s in ET.parse(path).iter("testsuite")
                  if s.get("timestamp")), None)
    return stamp[:10] if stamp else datetime.date.today().isoformat()


def read_load(path: Path) -> str | None:
    """'4.4 at the start, 2.1 at the end' from a file of lines 'start <1-min> ...' and
    'end <1-min> ...' (a copy of /proc/loadavg each); None when there is no such file."""
    if not path.exists():
        return None
    first = dict(line.split()[:2] for line in path.read_text().splitlines() if line.strip())
    return ", ".join(f"{first[when]} at the {when}" for when in ("start", "end") if when in first)


def notebooks(root: Path = Path(".")) -> list[str]:
    return sorted(f"{f}/{p.name}" for f in FOLDERS for p in (root / f).glob("*.ipynb"))


def table(times: dict) -> str:
    """Which run measured what; then one row per lesson: Run All in JupyterLab, and nbmake's
    times for the lesson, its solution and its exercise; then the totals."""
    nbmake, browser = times["nbmake"], times["browser"]
    seconds = nbmake["seconds"]
    rows = [f"nbmake: the full test run of {nbmake['date']} on the 2-core CI machine "
            f"({load_text(nbmake['load'])}). Run All in JupyterLab: the browser check "
            "(Debian's chromium, 1280x900; opening the notebook not counted), with its date "
            "and the load average before and after.", "",
            "| notebook | lesson: Run All in JupyterLab | lesson: nbmake | solution: nbmake | "
            "exercise: nbmake |", "|---|---|---|---|---|"]
    for lesson in sorted(n for n in seconds if n.startswith("notebooks/")):
        name = lesson.split("/", 1)[1]
        lab = browser.get(lesson)
        cols = [f"{lab['run_all']:.0f} s ({lab['date']}, load {lab['load']})" if lab
                else "not measured yet"] + [_s(seconds.get(f"{f}/{name}")) for f in FOLDERS]
        rows.append(f"| `{name.removesuffix('.ipynb')}` | {' | '.join(cols)} |")
    in_lab = [lab["run_all"] for name, lab in browser.items() if name in seconds]
    lab_total = f"**{sum(in_lab):.0f} s** ({len(in_lab)} lessons)" if in_lab else "-"
    rows.append(f"| **all {len(seconds)} notebooks** | {lab_total} | | | "
                f"**{_s(sum(seconds.values()))}** |")
    return "\n".join(rows)


def header_line(seconds: float, lab: dict | None = None) -> str:
    """The lesson's "Run time" line: nbmake's time, and Run All in JupyterLab once measured."""
    if lab is None:
        return (f"**Run time:** about {_round(seconds)} s on a 2-core CPU (the whole notebook "
                "under nbmake in CI; Run All in JupyterLab takes a little longer; see the "
                "README's run-time table).")
    return (f"**Run time:** Run All in JupyterLab took about {_round(lab['run_all'])} s on a "
            f"2-core CPU (load average {lab['load']}), and about {_round(seconds)} s under "
            "nbmake, without a browser; see the README's run-time table.")


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.0f} s"


def _round(seconds: float) -> int:
    return max(5, int(round(seconds / 5.0)) * 5)


def write(times: dict, root: Path = Path(".")) -> None:
    """Store the times, and write them into README.md, every lesson's opening cell whose
    line changes, the course map and the instructor guide."""
    (root / TIMES).parent.mkdir(exist_ok=True)
    (root / TIMES).write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
    readme = root / "README.md"
    readme.write_text(replace_block(readme.read_text(), table(times), START, END))
    for name, seconds in times["nbmake"]["seconds"].items():
        if name.startswith("notebooks/"):
            set_header(root / name, header_line(seconds, times["browser"].get(name)))
    course_map.write(root)  # the instructor guide quotes the same times


def set_header(path: Path, line: str) -> None:
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    if not LINE.search(first.source):
        raise ValueError(f"{path}: its first cell needs a line starting '**Run time:**'")
    source = LINE.sub(line, first.source)
    if source != first.source:  # a lesson whose time did not change is left untouched
        first.source = source
        nbformat.write(nb, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib run-times", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--write", type=Path, metavar="JUNIT_XML",
                     help="a JUnit XML file from a full test run (scripts/test writes one)")
    how.add_argument("--browser", type=Path, metavar="JUNIT_XML",
                     help="a JUnit XML file of a browser check run: only its lessons' Run All")
    parser.add_argument("--load", type=Path, metavar="FILE",
                        help="the run's load average: lines 'start ...' and 'end ...' "
                             "(default: loadavg beside the JUnit file)")
    args = parser.parse_args(argv)
    junit = args.write or args.browser
    times, date = course_map.run_times(), run_date(junit)
    times["browser"].update(browser_from_junit(junit, date))
    if args.write:
        seconds = from_junit(junit)
        missing = sorted(set(notebooks()) - seconds.keys())
        if missing:
            print(f"no time for {', '.join(missing)}: run the whole test suite first",
                  file=sys.stderr)
            return 1
        times["nbmake"] = {"date": date, "load": read_load(args.load or junit.parent / "loadavg"),
                           "seconds": {n: seconds[n] for n in notebooks()}}
    write(times)
    print(table(times))
    return 0
