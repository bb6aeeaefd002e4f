"""How long each notebook takes under nbmake, from a test run's JUnit XML: kept in
docs/run_times.json, in a README table, and in each lesson's opening line "Run time: ...".

    scripts/test                                    # writes artifacts/junit.xml
    python -m course_lib run-times --write artifacts/junit.xml

It also rewrites the course map and instructor guide, which quote the same times. A test
(tests/test_run_times.py) fails when these disagree or a notebook is missing."""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat

from course_lib.authoring import course_map
from course_lib.authoring.readme_blocks import replace_block

FOLDERS = ("notebooks", "solutions", "exercises")
TIMES = course_map.TIMES  # one file, which the course map reads too
START, END = "<!-- run-times:start -->", "<!-- run-times:end -->"
# The lesson's opening cell states its time on a line of its own, e.g.
# "**Run time:** about 40 s on a 2-core laptop (measured in CI, see README)."
LINE = re.compile(r"^\*\*Run time:\*\*.*$", re.MULTILINE)


def from_junit(path: Path) -> dict[str, float]:
    """'folder/name.ipynb' -> seconds, for every notebook test case in a JUnit XML file."""
    times = {}
    for case in ET.parse(path).iter("testcase"):
        name = case.get("name", "")
        if name.endswith(".ipynb"):
            folder = case.get("classname", "").removesuffix(f".{name}").rsplit(".", 1)[-1]
            times[f"{folder}/{name}"] = round(float(case.get("time", 0)), 1)
    return times


def notebooks(root: Path = Path(".")) -> list[str]:
    return sorted(f"{f}/{p.name}" for f in FOLDERS for p in (root / f).glob("*.ipynb"))


def table(times: dict[str, float]) -> str:
    """One row per lesson: the lesson, its solution and its exercise; then the total."""
    rows = ["| notebook | lesson | solution | exercise |", "|---|---|---|---|"]
    for lesson in sorted(n for n in times if n.startswith("notebooks/")):
        name = lesson.split("/", 1)[1]
        cols = [_s(times.get(f"{f}/{name}")) for f in FOLDERS]
        rows.append(f"| `{name.removesuffix('.ipynb')}` | {' | '.join(cols)} |")
    rows.append(f"| **all {len(times)} notebooks** | | | **{_s(sum(times.values()))}** |")
    return "\n".join(rows)


def header_line(seconds: float) -> str:
    return (f"**Run time:** about {_round(seconds)} s on a 2-core CPU (the whole notebook "
            "under nbmake in CI; Run All in JupyterLab takes a little longer; see the README's "
            "run-time table).")


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.0f} s"


def _round(seconds: float) -> int:
    return max(5, int(round(seconds / 5.0)) * 5)


def write(times: dict[str, float], root: Path = Path(".")) -> None:
    """Store the times, and write them into README.md and every lesson's opening cell."""
    (root / TIMES).parent.mkdir(exist_ok=True)
    (root / TIMES).write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
    readme = root / "README.md"
    readme.write_text(replace_block(readme.read_text(), table(times), START, END))
    for name, seconds in times.items():
        if name.startswith("notebooks/"):
            set_header(root / name, seconds)
    course_map.write(root)  # the instructor guide quotes the same times


def set_header(path: Path, seconds: float) -> None:
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    if not LINE.search(first.source):
        raise ValueError(f"{path}: its first cell needs a line starting '**Run time:**'")
    first.source = LINE.sub(header_line(seconds), first.source)
    nbformat.write(nb, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib run-times", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, metavar="JUNIT_XML", required=True,
                        help="a JUnit XML file from a full test run (scripts/test writes one)")
    args = parser.parse_args(argv)
    times = from_junit(args.write)
    missing = sorted(set(notebooks()) - times.keys())
    if missing:
        print(f"no time for {', '.join(missing)}: run the whole test suite first",
              file=sys.stderr)
        return 1
    write({n: times[n] for n in notebooks()})
    print(table(times))
    return 0
