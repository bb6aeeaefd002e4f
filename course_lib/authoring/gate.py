"""The gate: run lesson, solution and exercise notebooks and prove they are honest.

Every broken or demo cell must show its declared symptom and every fixed cell must not (an
observation must be present: its absence proves nothing). Errors are allowed only in
cells tagged raises-exception, as nbmake allows them, and one raised through the course's
code must read from its headline, not from our frames. Exercise stubs may fail only with
NotImplementedError, and every solution's check must pass.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from course_lib.authoring.cell_schema import PitfallCell, read_cells
from course_lib.authoring.exercise_cells import judge_exercise_cells
from course_lib.authoring.outputs import (
    Verdict,
    describe_error,
    error_output,
    executed,
    first_line,
    not_read_from_the_top,
    observations,
)
from course_lib.protocol import ERROR, RAISES, tags


@dataclass
class NotebookReport:
    """The gate's findings for one notebook."""

    path: str
    verdicts: list[Verdict]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems and all(v.ok for v in self.verdicts)


def judge(cell: PitfallCell, nb_cell: Any) -> Verdict:
    """Did the executed cell show (broken, demo) or not show (fixed) its symptom?"""
    want = cell.role != "fixed"
    row = (cell.number, f"{cell.pitfall} {cell.role}",
           str(cell.symptom) if want else f"no {cell.symptom}")
    if not executed(nb_cell):
        return Verdict(*row, "the cell was not executed", False)
    if cell.symptom.kind == ERROR:
        err = error_output(nb_cell)
        shown = (err is not None and err.get("ename") == cell.symptom.name
                 and cell.symptom.in_message(str(err.get("evalue", ""))))
        return Verdict(*row, describe_error(err), shown if want else err is None)
    values = observations(nb_cell).get(cell.symptom.name)
    if not values:
        return Verdict(*row, f"no observation {cell.symptom.name!r} in the outputs", False)
    return Verdict(*row, f"{cell.symptom.name} = {values}", all(v is want for v in values))


def unexpected_errors(nb: Any) -> list[str]:
    """Errors in cells not tagged raises-exception (nbmake fails on those)."""
    found = []
    for number, cell in enumerate(nb.cells, start=1):
        err = error_output(cell)
        if err is not None and RAISES not in tags(cell):
            found.append(f"cell {number}: unexpected {describe_error(err)}")
    return found


def errors_not_read_from_the_top(nb: Any) -> list[str]:
    """Errors raised through the course's code but shown with its frames first: a learner
    would scroll through our machinery before reading what went wrong."""
    found = []
    for number, cell in enumerate(nb.cells, start=1):
        err = error_output(cell)
        why = not_read_from_the_top(err) if err is not None else ""
        if why:
            found.append(f"cell {number}: {why}: raise it through "
                         "course_lib.launching.headline.headline_first")
    return found


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def output_widgets_written(nb: Any) -> list[str]:
    """Output widgets that received output while the notebook ran. In a headless run
    (nbclient) each such output can leave the cell waiting for its timeout, 300 s under
    nbmake; course_lib.plots.explore.redrawn_below says why and how to avoid it."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    written = [model_id for model_id, model in state.items()
               if model.get("model_name") == "OutputModel"
               and model.get("state", {}).get("outputs")]
    if not written:
        return []
    return [f"{len(written)} Output widget(s) received output while the notebook ran "
            "(a headless run can stall there until the cell's timeout): display the first "
            "view as plain output and draw into the widget only when a control changes "
            "(course_lib.plots.explore.redrawn_below)"]


def check_executed(path: str, nb: Any, problems: list[str] | None = None) -> NotebookReport:
    """Judge an executed notebook: metadata, unexpected errors, errors not shown headline
    first, Output widgets written while it ran, pitfall and exercise cells."""
    cells, meta_problems = read_cells(nb)
    verdicts = [judge(c, nb.cells[c.number - 1]) for c in cells] + judge_exercise_cells(nb)
    verdicts.sort(key=lambda v: v.number)
    return NotebookReport(path, verdicts, [*(problems or []), *meta_problems,
                                           *unexpected_errors(nb),
                                           *errors_not_read_from_the_top(nb),
                                           *output_widgets_written(nb)])


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
    """A readable table, one row per judged cell, then the problems."""
    lines = [f"{'PASS' if report.ok else 'FAIL'}  {report.path}"]
    if report.verdicts:
        lines.append(f"  {'cell':>4}  {'what':<15} {'expects':<36} {'saw':<60} ok")
    for v in report.verdicts:
        lines.append(f"  {v.number:>4}  {v.what:<15} {first_line(v.expects, 36):<36} "
                     f"{first_line(v.saw):<60} {'yes' if v.ok else 'NO'}")
    if not report.verdicts:
        lines.append("  (no pitfall or exercise cells)")
    lines.extend(f"  problem: {p}" for p in report.problems)
    return "\n".join(lines)


def notebook_paths(args: list[str]) -> list[Path]:
    """Notebook files named, and the .ipynb files inside folders named."""
    paths: list[Path] = []
    for arg in args:
        p = Path(arg)
        paths.extend(sorted(p.glob("*.ipynb")) if p.is_dir() else [p])
    return paths


def gate(paths: list[Path], already_executed: bool, timeout: int) -> list[NotebookReport]:
    """Judge each notebook, running it first unless it was already executed."""
    reports = []
    for path in paths:
        stopped: list[str] = []
        if already_executed:
            nb = nbformat.read(path, as_version=4)
        else:
            nb, stopped = execute(path, timeout)
        reports.append(check_executed(str(path), nb, stopped))
    return reports


def main(argv: list[str] | None = None) -> int:
    """python -m course_lib gate: exit 0 only when every notebook passes."""
    parser = _parser()
    args = parser.parse_args(argv)
    paths = notebook_paths(args.notebooks)
    if not paths or not all(p.is_file() for p in paths):
        parser.error(f"no notebooks found in {args.notebooks}" if not paths else
                     f"no such notebook: {', '.join(str(p) for p in paths if not p.is_file())}")
    reports = gate(paths, args.executed, args.timeout)
    for report in reports:
        print(format_report(report))
    failed = [r.path for r in reports if not r.ok]
    print(f"\n{len(reports) - len(failed)} of {len(reports)} notebook(s) pass the gate.")
    return 1 if failed else 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m course_lib gate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="+", help="notebook files or folders of notebooks")
    p.add_argument("--executed", action="store_true",
                   help="the notebooks were already executed (e.g. by nbmake --overwrite on a "
                        "copy): judge their outputs without running them again")
    p.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    return p
