"""The pitfall gate: run lesson notebooks and prove every broken cell really breaks.

A broken or demo cell must show its declared symptom, a fixed cell must not (an
observation is needed: its absence proves nothing). Errors are allowed only in cells
tagged raises-exception, as nbmake allows them.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from course_lib.checks.schema import RAISES, PitfallCell, read_cells
from course_lib.teach.observe import MIME as OBSERVATION


@dataclass(frozen=True)
class Verdict:
    """What one pitfall cell was expected to show, what it showed, and whether that is right."""

    cell: PitfallCell
    saw: str
    ok: bool


@dataclass
class NotebookReport:
    """The gate's findings for one notebook."""

    path: str
    verdicts: list[Verdict]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems and all(v.ok for v in self.verdicts)


def observations(cell: Any) -> dict[str, list[bool]]:
    """Every observe() value a cell displayed, by name."""
    seen: dict[str, list[bool]] = {}
    for out in cell.get("outputs", []):
        data = out.get("data", {}).get(OBSERVATION)
        if isinstance(data, dict) and "name" in data:
            seen.setdefault(data["name"], []).append(bool(data.get("value")))
    return seen


def error_output(cell: Any) -> Any | None:
    """The cell's error output, if it raised."""
    return next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)


def judge(cell: PitfallCell, nb_cell: Any) -> Verdict:
    """Did the executed cell show (broken, demo) or not show (fixed) its symptom?"""
    want = cell.role != "fixed"
    if nb_cell.get("execution_count") is None:
        return Verdict(cell, "the cell was not executed", False)
    if cell.symptom.kind == "error":
        return _judge_error(cell, error_output(nb_cell), want)
    values = observations(nb_cell).get(cell.symptom.name)
    if not values:
        return Verdict(cell, f"no observation {cell.symptom.name!r} in the outputs", False)
    return Verdict(cell, f"{cell.symptom.name} = {values}", all(v is want for v in values))


def _judge_error(cell: PitfallCell, err: Any | None, want: bool) -> Verdict:
    if err is None:
        return Verdict(cell, "no error", not want)
    evalue = str(err.get("evalue", ""))
    saw = f"{err.get('ename')}: {_first_line(evalue)}"
    shown = err.get("ename") == cell.symptom.name and cell.symptom.match in evalue
    return Verdict(cell, saw, want and shown)


def _first_line(text: str, width: int = 70) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def unexpected_errors(nb: Any) -> list[str]:
    """Errors in cells not tagged raises-exception (nbmake fails on those)."""
    found = []
    for number, cell in enumerate(nb.cells, start=1):
        err = error_output(cell)
        if err is not None and RAISES not in cell.get("metadata", {}).get("tags", []):
            found.append(f"cell {number}: unexpected {err.get('ename')}: "
                         f"{_first_line(str(err.get('evalue', '')))}")
    return found


def check_executed(path: str, nb: Any, problems: list[str] | None = None) -> NotebookReport:
    """Judge an executed notebook: metadata, unexpected errors, every pitfall cell."""
    cells, meta_problems = read_cells(nb)
    verdicts = [judge(c, nb.cells[c.number - 1]) for c in cells]
    return NotebookReport(path, verdicts, [*(problems or []), *meta_problems,
                                           *unexpected_errors(nb)])


def execute(path: Path, timeout: int) -> tuple[Any, list[str]]:
    """Run the notebook in its own folder as nbmake does; return it and any stop reason."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except CellExecutionError as exc:
        return nb, [f"execution stopped at an unexpected {exc.ename}; later cells did not run"]
    return nb, []


def format_report(report: NotebookReport) -> str:
    """A readable table: one row per pitfall cell, then the problems."""
    lines = [f"{'PASS' if report.ok else 'FAIL'}  {report.path}"]
    if report.verdicts:
        lines.append(f"  {'cell':>4}  {'id':<4} {'role':<6} {'expects':<40} {'saw':<44} ok")
    for v in report.verdicts:
        lines.append(f"  {v.cell.number:>4}  {v.cell.pitfall:<4} {v.cell.role:<6} "
                     f"{_expectation(v.cell):<40} {v.saw:<44} {'yes' if v.ok else 'NO'}")
    if not report.verdicts:
        lines.append("  (no pitfall cells)")
    lines.extend(f"  problem: {p}" for p in report.problems)
    return "\n".join(lines)


def _expectation(cell: PitfallCell) -> str:
    return str(cell.symptom) if cell.role != "fixed" else f"no {cell.symptom}"


def notebook_paths(args: list[str]) -> list[Path]:
    """Notebook files named, and the .ipynb files inside folders named."""
    paths: list[Path] = []
    for arg in args:
        p = Path(arg)
        paths.extend(sorted(p.glob("*.ipynb")) if p.is_dir() else [p])
    return paths


def gate(paths: list[Path], executed: bool, timeout: int) -> list[NotebookReport]:
    """Judge each notebook, running it first unless it was already executed."""
    reports = []
    for path in paths:
        if executed:
            nb, stopped = nbformat.read(path, as_version=4), []
        else:
            nb, stopped = execute(path, timeout)
        reports.append(check_executed(str(path), nb, stopped))
    return reports


def main(argv: list[str] | None = None) -> int:
    """python -m course_lib.gate: exit 0 only when every notebook passes."""
    args = _parser().parse_args(argv)
    if args.coverage or args.write_readme:
        from course_lib.checks.coverage import main as coverage

        return coverage(notebook_paths(args.notebooks or ["notebooks"]), args.write_readme)
    if not args.notebooks:
        _parser().error("name at least one notebook or folder")
    reports = gate(notebook_paths(args.notebooks), args.executed, args.timeout)
    for report in reports:
        print(format_report(report))
    failed = [r.path for r in reports if not r.ok]
    print(f"\n{len(reports) - len(failed)} of {len(reports)} notebook(s) pass the pitfall gate.")
    return 1 if failed else 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m course_lib.gate", description=__doc__)
    p.add_argument("notebooks", nargs="*", help="notebook files or folders of notebooks")
    p.add_argument("--executed", action="store_true",
                   help="the notebooks were already executed (e.g. by nbmake --overwrite on a "
                        "copy): judge their outputs without running them again")
    p.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    p.add_argument("--coverage", action="store_true",
                   help="print the pitfall coverage table (markdown) of the notebooks "
                        "(default folder: notebooks)")
    p.add_argument("--write-readme", action="store_true",
                   help="write the coverage table into README.md between its markers")
    return p


if __name__ == "__main__":
    sys.exit(main())
