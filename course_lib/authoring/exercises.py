"""python -m course_lib exercises build [--check]: generate exercises/ from solutions/."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

from course_lib.authoring.stubs import MarkerError, exercise_notebook

LESSON = re.compile(r"^[0-9]{2}_\w+\.ipynb$")  # 03_data_sharding.ipynb


def expected(solutions: Path) -> dict[str, str]:
    """Exercise file name -> the text it must have, for every solutions notebook."""
    misnamed = [p.name for p in sorted(solutions.glob("*.ipynb")) if not LESSON.match(p.name)]
    if misnamed:  # the gate would judge them, but no exercise would ever be built
        raise MarkerError(f"{solutions}: {', '.join(misnamed)}: name a solutions notebook "
                          "after its lesson, NN_short_name.ipynb")
    texts = {}
    for path in sorted(solutions.glob("*.ipynb")):
        try:
            nb = exercise_notebook(nbformat.read(path, as_version=4))
        except MarkerError as exc:
            raise MarkerError(f"{path}: {exc}") from None
        texts[path.name] = nbformat.writes(nb) + "\n"
    return texts


def differences(texts: dict[str, str], exercises: Path) -> list[str]:
    """What in `exercises` differs from the generated texts (stale, missing, orphaned)."""
    found = []
    for name, text in texts.items():
        path = exercises / name
        if not path.exists():
            found.append(f"missing: {path}")
        elif path.read_text() != text:
            found.append(f"out of date: {path}")
    found += [f"no source in solutions/: {p}" for p in sorted(exercises.glob("*.ipynb"))
              if p.name not in texts]
    return found


def build(solutions: Path, exercises: Path, check: bool) -> int:
    """Write (or with check=True only compare) every exercise notebook; 1 when stale."""
    texts = expected(solutions)
    stale = differences(texts, exercises)
    if check:
        for line in stale:
            print(line)
        if stale:
            print("exercises/ is out of date: run python -m course_lib exercises build")
        return 1 if stale else 0
    exercises.mkdir(exist_ok=True)
    for name, text in texts.items():
        (exercises / name).write_text(text)
    for orphan in (p for p in exercises.glob("*.ipynb") if p.name not in texts):
        orphan.unlink()
    print(f"wrote {len(texts)} exercise notebook(s) to {exercises}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib exercises", description=__doc__)
    parser.add_argument("command", choices=["build"])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when exercises/ is out of date")
    parser.add_argument("--solutions", type=Path, default=Path("solutions"))
    parser.add_argument("--exercises", type=Path, default=Path("exercises"))
    args = parser.parse_args(argv)
    try:
        return build(args.solutions, args.exercises, args.check)
    except MarkerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
