"""Committed notebooks carry no outputs or execution counts, the code, tests, benchmarks
and notebooks pass ruff with the project's rules (pyproject.toml, [tool.ruff]), and a module
of the code, scripts or benchmarks past 300 lines states its one job. This is the test run's
only ruff pass."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_lib.authoring.gate import notebook_paths

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("notebooks", "solutions", "exercises")


@pytest.mark.parametrize("path", notebook_paths([str(ROOT / f) for f in FOLDERS]),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [n for n, c in enumerate(nb.cells, start=1) if c.cell_type == "code"
             and (c.outputs or c.execution_count is not None)]
    assert not dirty, (f"cells {dirty} have outputs or execution counts: clear them "
                       "(JupyterLab: Edit > Clear Outputs of All Cells) before committing")


@pytest.mark.parametrize("path", notebook_paths([str(ROOT / f) for f in FOLDERS]),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_cell_has_its_own_id(path):
    """nbformat 4.5 cells need an id (nbformat only warns, and will refuse later); a script
    that inserts cells must give them one."""
    cells = json.loads(path.read_text())["cells"]
    missing = [n for n, c in enumerate(cells, start=1) if not c.get("id")]
    assert not missing, f"cells {missing} have no id: give each a short unique one"
    ids = [c["id"] for c in cells]
    assert len(set(ids)) == len(ids), "two cells share an id"


def test_ruff_passes_on_the_code_and_the_notebooks():
    folders = ("course_lib", "tests", "benchmarks", *FOLDERS)
    targets = [str(ROOT / f) for f in folders if (ROOT / f).exists()]
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run([str(ruff), "check", "--no-cache", *targets], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# -- module length: one job per file --------------------------------------------------------
# 300 lines is a prompt, not a cap: past it, ask whether the module has two jobs. If it has,
# split it by job (never by count: moving code into whichever neighbour has room is worse than
# a long module). If it has one, its docstring's first line starts with JOB and names it.

GUIDE_LINES = 300
JOB = "One job:"
CODE = ("course_lib", "scripts", "benchmarks")


def line_count(source: str) -> int:
    return len(source.splitlines())


def states_its_job(source: str) -> bool:
    """Whether the module docstring's first line starts with JOB and says more."""
    try:
        docstring = ast.get_docstring(ast.parse(source)) or ""
    except SyntaxError:
        return False
    first = docstring.strip().splitlines()[0] if docstring.strip() else ""
    return first.startswith(JOB) and len(first) > len(JOB) + 10


def unexplained_length(source: str) -> bool:
    return line_count(source) > GUIDE_LINES and not states_its_job(source)


def code_modules() -> dict[str, str]:
    """Every .py file under CODE, by its path from the repository root."""
    return {path.relative_to(ROOT).as_posix(): path.read_text()
            for folder in CODE for path in sorted((ROOT / folder).rglob("*.py"))
            if "__pycache__" not in path.parts}


def test_the_length_guide_sees_a_long_module_and_its_job():
    body = "x = 1\n" * GUIDE_LINES
    assert not unexplained_length('"""A job."""\n')
    assert unexplained_length('"""A job."""\n' + body)
    assert not unexplained_length(f'"""{JOB} the x-ray\'s event schemas, one per kind."""\n'
                                  + body)
    assert unexplained_length(f'"""Events.\n\n{JOB} the schemas."""\n' + body)  # not first
    assert unexplained_length(f'"""{JOB}"""\n' + body)  # names no job
    assert unexplained_length(f"# {JOB} a comment is not the docstring\n" + body)


def test_a_module_over_300_lines_states_its_one_job():
    modules = code_modules()
    assert "course_lib/launching/launcher.py" in modules, "the walk found no code"
    over = [f"{path} ({line_count(source)} lines)" for path, source in modules.items()
            if unexplained_length(source)]
    assert not over, (
        f"over {GUIDE_LINES} lines: {over}. Does the module do two things? Split it by job "
        "(CONTRIBUTING.md, 'Module size'). If it does one, start its docstring with "
        f"{JOB!r} followed by that job; never split only to get under the number.")
