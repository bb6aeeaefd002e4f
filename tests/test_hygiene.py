"""Committed notebooks carry no outputs or execution counts, and the code, tests, benchmarks
and notebooks pass ruff with the project's rules (pyproject.toml, [tool.ruff]). This is the
test run's only ruff pass."""

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
