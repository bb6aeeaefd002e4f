"""The coverage table: every pitfall id -> the lessons whose cells show it (their roles and
symptoms), read from the notebooks' metadata, with the ids still to come; kept in README.md
between markers. Cells are named by pitfall, role and symptom, never by position, so that
editing a lesson's prose leaves the table as it is (the gate's report gives positions)."""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path

import nbformat

from course_lib.authoring import readme_blocks
from course_lib.authoring.cell_schema import PitfallCell, read_cells
from course_lib.authoring.gate import notebook_paths
from course_lib.pitfalls import PITFALLS, SAME_AS
from course_lib.protocol import ROLES

START, END = "<!-- coverage:start -->", "<!-- coverage:end -->"


def collect(paths: list[Path]) -> tuple[dict[str, list[str]], list[str]]:
    """Per pitfall id, one entry per notebook that shows it; and every metadata problem."""
    covered: dict[str, list[str]] = defaultdict(list)
    problems: list[str] = []
    for path in paths:
        cells, found = read_cells(nbformat.read(path, as_version=4))
        problems.extend(f"{path}: {p}" for p in found)
        by_id: dict[str, list[PitfallCell]] = defaultdict(list)
        for c in cells:
            by_id[c.pitfall].append(c)
        for pid, shown in by_id.items():
            covered[pid].append(f"`{path.stem}` {entry(shown)}")
    return covered, problems


def entry(cells: list[PitfallCell]) -> str:
    """'2 broken, demo, 2 fixed (observed same_samples)': roles counted, symptoms named."""
    counts = Counter(c.role for c in cells)
    roles = [f"{counts[r]} {r}" if counts[r] > 1 else r for r in ROLES if counts[r]]
    symptoms = dict.fromkeys(str(c.symptom) for c in cells)  # distinct, in notebook order
    return f"{', '.join(roles)} ({', '.join(symptoms)})"


def table(covered: dict[str, list[str]]) -> str:
    """The markdown table, one row per registered id, in registry order."""
    covered = {**covered, **{pid: covered.get(other, []) for pid, other in SAME_AS.items()}}
    done = sum(1 for pid in PITFALLS if covered.get(pid))
    rows = [f"{done} of {len(PITFALLS)} pitfalls have cells in a lesson so far.", "",
            "| id | pitfall | planned lesson | shown in |", "|---|---|---|---|"]
    for pid, p in PITFALLS.items():
        shown = "; ".join(covered.get(pid, [])) or "to come"
        if pid in SAME_AS:
            shown = f"as {SAME_AS[pid]}: {shown}"
        rows.append(f"| {pid} | {p.title} | {', '.join(p.lessons)} | {shown} |")
    return "\n".join(rows)


def replace_block(text: str, block: str) -> str:
    """README text with the coverage block replaced; ValueError when the markers are missing."""
    return readme_blocks.replace_block(text, block, START, END)


def report(paths: list[Path], write_readme: bool, readme: Path = Path("README.md")) -> int:
    """Print the table, or write it into README.md; exit 1 on metadata problems."""
    covered, problems = collect(paths)
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    block = table(covered)
    if not write_readme:
        print(block)
    else:
        try:
            readme.write_text(replace_block(readme.read_text(), block))
        except (OSError, ValueError) as exc:
            print(exc, file=sys.stderr)
            return 1
        print(f"wrote the coverage table into {readme}")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    """python -m course_lib coverage [NOTEBOOK...] [--write-readme]."""
    parser = argparse.ArgumentParser(prog="python -m course_lib coverage", description=__doc__)
    parser.add_argument("notebooks", nargs="*", default=["notebooks"],
                        help="notebook files or folders of notebooks (default: notebooks)")
    parser.add_argument("--write-readme", action="store_true",
                        help="write the table into README.md between its markers, instead of "
                             "printing it")
    args = parser.parse_args(argv)
    return report(notebook_paths(args.notebooks), args.write_readme)
