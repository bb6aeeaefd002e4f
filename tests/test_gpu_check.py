"""scripts/gpu-check's summary logic: which notebook failed, and its first unexpected error."""

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from gpu_check import runner, summary  # noqa: E402 - scripts/ is not a package path


def executed_notebook(path: Path, tagged_error: bool, untagged_error: bool) -> Path:
    """A notebook as nbclient leaves it: outputs in place, an error where asked."""
    ok = new_code_cell("print(1)", execution_count=1,
                       outputs=[new_output("stream", name="stdout", text="1\n")])
    cells = [ok]
    if tagged_error:
        cells.append(new_code_cell("raise KeyError('shown on purpose')", execution_count=2,
                                   metadata={"tags": ["raises-exception"]},
                                   outputs=[new_output("error", ename="KeyError",
                                                       evalue="'shown on purpose'", traceback=[])]))
    if untagged_error:
        cells.append(new_code_cell("raise ValueError('boom')", execution_count=3,
                                   outputs=[new_output("error", ename="ValueError",
                                                       evalue="boom", traceback=[])]))
    nbformat.write(new_notebook(cells=cells), path)
    return path


def test_an_untagged_error_fails_the_notebook_and_is_named(tmp_path):
    nb = executed_notebook(tmp_path / "bad.ipynb", tagged_error=True, untagged_error=True)
    record = runner.judge(nb, 1.0)
    assert not record["ok"]
    assert record["first_error"] == "cell 3: ValueError: boom"


def test_a_tagged_error_alone_passes(tmp_path):
    nb = executed_notebook(tmp_path / "good.ipynb", tagged_error=True, untagged_error=False)
    record = runner.judge(nb, 1.0)
    assert record["ok"], record
    assert record["first_error"] == ""


def test_a_notebook_stopped_early_fails_with_the_reason(tmp_path):
    nb = executed_notebook(tmp_path / "slow.ipynb", tagged_error=False, untagged_error=False)
    record = runner.judge(nb, 400.0, stopped="killed: still running when the cap ran out")
    assert not record["ok"]
    assert record["first_error"].startswith("killed")


def test_the_summary_passes_only_when_notebooks_and_tests_pass(tmp_path):
    good = runner.judge(executed_notebook(tmp_path / "a.ipynb", True, False), 2.0)
    bad = runner.judge(executed_notebook(tmp_path / "b.ipynb", False, True), 3.0)
    env = {"torch": "2.x", "gpu_count": 1, "gpus": "Some GPU"}
    tests_ok = "1 passed in 2.00s\nrc=0"
    text = summary.render(env, [good, bad], tests_ok, 10)
    assert "**FAIL**: 1 of 2 notebooks pass" in text
    assert f"| {bad['notebook']} | FAIL | 3 s | cell 2: ValueError: boom |" in text
    assert summary.render(env, [good], tests_ok, 10).startswith("# GPU check\n\n**PASS**")
    tests_failed = "1 failed, 3 passed in 9.00s\nrc=1"
    assert "quick tests: FAIL (1 failed, 3 passed in 9.00s)" in summary.render(
        env, [good], tests_failed, 10)


@pytest.mark.kernel  # starts a Jupyter kernel
def test_the_runner_executes_and_judges_a_notebook(tmp_path):
    path = tmp_path / "two.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1"),
                                       new_code_cell("raise ValueError('boom')")]), path)
    assert runner.main([str(tmp_path / "out"), "1", "120", str(path)]) == 1
    [record] = json.loads((tmp_path / "out" / "notebooks.json").read_text())
    assert record["first_error"] == "cell 2: ValueError: boom"
    assert not record["ok"]
