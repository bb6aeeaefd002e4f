"""Committed notebooks carry no outputs or execution counts, the code, tests, benchmarks
and notebooks pass ruff with the project's rules (pyproject.toml, [tool.ruff]), and no module
of the code, scripts or benchmarks grows past 300 lines without a written reason. This is the
test run's only ruff pass."""

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

MAX_LINES = 300
REASON = "Over 300 lines because"  # a line of the module docstring that starts so is a reason
CODE = ("course_lib", "scripts", "benchmarks")
# Known debts: modules over 300 lines today, each to be split (or given a reason) under the
# issue named. A new module over the limit is not added here: split it, or write its reason.
# An entry fails once its module is back under the limit (or has a reason): delete it then.
KNOWN_LONG = {
}


def line_count(source: str) -> int:
    return len(source.splitlines())


def has_reason(source: str) -> bool:
    """Whether the module docstring has a line starting with REASON."""
    try:
        docstring = ast.get_docstring(ast.parse(source)) or ""
    except SyntaxError:
        return False
    return any(line.strip().startswith(REASON) for line in docstring.splitlines())


def too_long(source: str) -> bool:
    return line_count(source) > MAX_LINES and not has_reason(source)


def code_modules() -> dict[str, str]:
    """Every .py file under CODE, by its path from the repository root."""
    return {path.relative_to(ROOT).as_posix(): path.read_text()
            for folder in CODE for path in sorted((ROOT / folder).rglob("*.py"))
            if "__pycache__" not in path.parts}


def test_the_length_rule_sees_a_long_module_and_its_reason():
    short, long = '"""A job."""\n', '"""A job."""\n' + "x = 1\n" * MAX_LINES
    reasoned = f'"""A job.\n\n{REASON} its table is one piece."""\n' + "x = 1\n" * MAX_LINES
    assert not too_long(short)
    assert too_long(long)
    assert not too_long(reasoned)
    assert too_long("# " + REASON + " (a comment is not the docstring)\n" + "x = 1\n" * MAX_LINES)


def test_no_module_is_over_300_lines_without_a_reason():
    modules = code_modules()
    assert "course_lib/launching/launcher.py" in modules, "the walk found no code"
    over = [f"{path} ({line_count(source)} lines)" for path, source in modules.items()
            if too_long(source) and path not in KNOWN_LONG]
    assert not over, (f"over {MAX_LINES} lines: {over}. Split each into modules with one job, "
                      f"or start a line of its docstring with {REASON!r} and say why.")


def test_every_known_long_module_is_still_a_debt():
    modules = code_modules()
    paid = [path for path in KNOWN_LONG if path not in modules or not too_long(modules[path])]
    assert not paid, (f"{paid} are gone, under {MAX_LINES} lines or have a reason now: delete "
                      "them from KNOWN_LONG in tests/test_hygiene.py")
