"""The x-ray as a learner calls it: `python -m course_lib xray` (its text, JSON and exit
status), and `xray(fn)` in a notebook (a cell's lines named as IPython names them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.xray import cli
from course_lib.xray.report import CONFIRMED, FAILED, NOT_JUDGED, STATUSES

ROOT = Path(__file__).parent.parent
CASES = Path(__file__).parent / "xray_cases"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "course_lib", "xray", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=180)


def test_command_line_json_and_exit_status() -> None:
    """`python -m course_lib xray --json` prints one JSON object and exits 1 on a finding."""
    script = CASES / "bad_P03_no_sampler.py"
    proc = _cli("--nproc-per-node", "2", "--json", str(script))
    report = json.loads(proc.stdout)
    assert set(report) >= {"findings", "checked", "not_checked"}
    assert proc.returncode == CONFIRMED
    finding = next(f for f in report["findings"] if f["id"] == "P03")
    assert set(finding) == {"id", "title", "evidence", "where", "lesson", "certainty"}
    assert finding["where"].startswith(os.path.relpath(script, ROOT))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a CPU machine")
def test_a_script_that_cannot_train_here_says_why_on_the_report_s_first_line() -> None:
    """Issue 41, as printed: the cause first, nothing judged (one line says so for every
    rule), exit status 3, and the help names every status."""
    from test_xray_cases import header

    case = CASES / "cannot_exit_no_gpus.py"
    proc = _cli(str(case.relative_to(ROOT)))
    report = proc.stdout.split("\n\n", 1)[1].splitlines()  # the script's own output first
    first = header(case, "first line").replace("{script}", str(case.relative_to(ROOT)))
    assert report[0].startswith(first), proc.stdout
    assert report[1].endswith("nothing was judged.")
    from course_lib.xray.detectors import in_report_order

    every = ", ".join(r.id for r in in_report_order())
    assert every.startswith("P18, P03, P04, P20, X1, X2, P16, S1, X3, P05, P08, P09, P10, ")
    assert report[2:] == ["Not judged:", f"  {every}: the script did not train here (the "
                                         "first line says why)"]
    assert proc.returncode == NOT_JUDGED
    help_text = _cli("--help").stdout
    assert all(f"  {code}  {meaning}" in help_text for code, meaning in STATUSES.items())


def test_crash_gives_root_cause_first_findings_and_what_was_not_judged(capsys) -> None:
    """Issue 36 item 4: a run that failed lists every rule it did not find as not judged,
    with the reason, in JSON and in text; its findings up to the failure stay."""
    status = cli.main(["--json", "--timeout", "60", str(CASES / "bad_P03_then_crash.py")])
    report = json.loads(capsys.readouterr().out)
    assert status == CONFIRMED and [f["id"] for f in report["findings"]] == ["P03"]
    assert report["error"].startswith("2 of 2 rank(s) failed. First failure: rank 1, "
                                      "RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert report["checked"] == []
    failed = [u for u in report["not_checked"]
              if u.endswith(": the run failed before it finished, so an absence proves nothing")]
    assert len(failed) >= 10 and "P18" in {u.split(":")[0] for u in failed}


HANG = '''
import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
print("waiting")  # on every rank: P16, seen only if the stopped rank's events come back
if int(os.environ["RANK"]) == 0:
    dist.all_reduce(torch.ones(1))
else:
    while not os.path.exists("/nonexistent/flag"):  # waits for a file nobody writes
        time.sleep(0.1)
'''


def test_hang_ends_at_the_timeout_with_the_desync_report(tmp_path, capsys) -> None:
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    status = cli.main(["--json", "--timeout", "8", str(script)])
    report = json.loads(capsys.readouterr().out)
    assert status == CONFIRMED, report
    assert "Desync report" in report["error"] and "hang.py" in report["error"]
    assert [(f["id"], f["certainty"]) for f in report["findings"]] == [
        ("P16", "confirmed"), ("S1", "suspected")]
    assert "rank 1 never issued it" in report["findings"][1]["evidence"]
    assert "time.sleep(0.1)" in report["error"]  # the stopped rank's stack


def test_a_run_that_fails_without_a_finding_exits_2(tmp_path, capsys) -> None:
    script = tmp_path / "boom.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
                      "raise RuntimeError('boom')\n")
    status = cli.main(["--json", "--timeout", "30", str(script)])
    report = json.loads(capsys.readouterr().out)
    assert status == FAILED and "cause" not in report and report["findings"] == [], report


def test_notebook_function() -> None:
    """xray(fn) on a notebook-style function: its finding, and its Run's results."""
    from course_lib.xray import xray

    report = xray(_every_rank_all_data, world_size=2, timeout=60)
    assert report.ids == ["P03"], str(report)
    assert report.findings[0].where.endswith(f"test_xray_cli.py:{_LOADER_LINE}")
    assert report.run is not None and report.run.results == [8, 8]
    assert report.exit_status == CONFIRMED and "P03" in report._repr_html_()


def _every_rank_all_data() -> int:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)  # the same data on every rank
    model = torch.nn.Linear(4, 1)
    loader = DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=4)  # _LOADER_LINE
    steps = 0
    for (x,) in loader:
        model(x).sum().backward()
        steps += 1
    return steps


_LOADER_LINE = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                    if line.endswith("# _LOADER_LINE"))


def test_the_x_ray_is_a_function_of_its_package_whatever_was_imported_first() -> None:
    """N7: `from course_lib.xray import xray` is the function, before or after any other
    x-ray module was imported; the package itself is a plain module."""
    code = ("import importlib, types, sys\n"
            "import course_lib.xray.report\n"
            "from course_lib.xray import xray\n"
            "import course_lib\n"
            "assert isinstance(xray, types.FunctionType), xray\n"
            "assert type(sys.modules['course_lib.xray']) is types.ModuleType\n"
            "assert course_lib.xray is sys.modules['course_lib.xray']\n"
            "assert 'xray' not in course_lib.__all__\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_a_notebook_cell_is_named_as_ipython_names_it(monkeypatch):
    import types

    import IPython

    from course_lib.launching.cells import cell_name, name_cell_paths, name_cells

    names = {"/tmp/ipykernel_7/123.py": ("Cell", "In[4]")}
    shell = types.SimpleNamespace(compile=types.SimpleNamespace(format_code_name=names.get))
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    assert cell_name("/tmp/ipykernel_7/123.py:5") == "Cell In[4], line 5"
    assert cell_name("train.py:12") == "train.py:12"
    assert cell_name("") == ""
    assert name_cell_paths("a sampler made at /tmp/ipykernel_7/123.py:2 was never given") == \
        "a sampler made at Cell In[4], line 2 was never given"
    frame = 'File "/tmp/ipykernel_7/123.py", line 5, in boom'
    assert name_cells(f'  {frame}\n  File "train.py", line 2, in f') == \
        '  Cell In[4], line 5, in boom\n  File "train.py", line 2, in f'
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)  # not in a kernel
    assert cell_name("/tmp/ipykernel_7/123.py:5") == "/tmp/ipykernel_7/123.py:5"


XRAY_CELL = """
def every_rank_all_data():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
"""


def test_a_finding_from_a_notebook_cell_names_the_cell_and_line(monkeypatch):
    """A function compiled as IPython compiles a cell keeps its file through the launch, and
    the finding's where reads as IPython's tracebacks do: 'Cell In[7], line 4'."""
    import types

    import IPython
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset

    from course_lib.xray import xray

    filename = "/tmp/ipykernel_0/course-xray-cell.py"
    names = {filename: ("Cell", "In[7]")}
    shell = types.SimpleNamespace(compile=types.SimpleNamespace(format_code_name=names.get))
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    namespace = {"torch": torch, "DDP": DDP, "DataLoader": DataLoader,
                 "TensorDataset": TensorDataset, "__name__": "__main__"}
    exec(compile(XRAY_CELL, filename, "exec"), namespace)
    report = xray(namespace["every_rank_all_data"], world_size=2, timeout=60)
    assert report.ids == ["P03"], str(report)
    assert report.findings[0].where == "Cell In[7], line 5"


def test_a_finding_in_a_module_of_the_script_names_that_module(tmp_path, capsys,
                                                               monkeypatch) -> None:
    """A multi-file script (a trainer module beside main.py, as pytorch/examples' minGPT-ddp
    is): the where line names the file the collective came from, not main.py."""
    case = (CASES / "bad_X3_rank0_eval_through_ddp.py").read_text()
    (tmp_path / "trainer.py").write_text(case.replace('if __name__ == "__main__":\n    main()',
                                                      ""))
    (tmp_path / "main.py").write_text("from trainer import main\n\nmain()\n")
    monkeypatch.chdir(tmp_path)
    status = cli.main(["--json", "--timeout", "60", "main.py"])
    report = json.loads(capsys.readouterr().out)
    assert status == CONFIRMED and [f["id"] for f in report["findings"]] == ["X3"], report
    line = next(n for n, text in enumerate(case.splitlines(), 1) if "val = " in text)
    assert report["findings"][0]["where"] == f"trainer.py:{line}", report
