"""The x-ray on its case scripts: every buggy one shows exactly its pitfalls (confirmed),
every correct one shows none; the CLI's JSON shape and exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.xray import cli

CASES = Path(__file__).parent / "xray_cases"
ROOT = Path(__file__).parent.parent


def expected(path: Path) -> set[str]:
    """The ids a case declares on its first line: `# expect: P03 P04` or `# expect: none`."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect:"), f"{path.name}: first line must be '# expect: ...'"
    ids = first.split(":", 1)[1].split()
    return set() if ids == ["none"] else set(ids)


def case_args(path: Path) -> list[str]:
    """Extra CLI arguments a case asks for on its second line: `# xray: --nproc-per-node 3`."""
    second = (path.read_text().splitlines() + ["", ""])[1]
    return second.split(":", 1)[1].split() if second.startswith("# xray:") else []


def run_case(path: Path, capsys) -> tuple[dict, int]:
    status = cli.main(["--json", "--timeout", "60", *case_args(path), str(path)])
    report = json.loads(capsys.readouterr().out)
    return report, status


@pytest.mark.parametrize("path", sorted(CASES.glob("*.py")), ids=lambda p: p.stem)
def test_case(path: Path, capsys) -> None:
    report, status = run_case(path, capsys)
    confirmed = {f["id"] for f in report["findings"] if f["certainty"] == "confirmed"}
    want = expected(path)
    assert confirmed == want, json.dumps(report, indent=1)
    if not want:  # a correct script: no finding at all, not even a suspicion
        assert report["findings"] == [], json.dumps(report, indent=1)
        assert status == 0 and report["checked"]
    else:
        assert status == 1
    for f in report["findings"]:
        assert f["evidence"] and f["lesson"].startswith("notebooks/"), f


def test_command_line_json_and_exit_status() -> None:
    """`python -m course_lib xray --json` prints one JSON object and exits 1 on a finding."""
    script = CASES / "bad_P03_no_sampler.py"
    proc = subprocess.run(
        [sys.executable, "-m", "course_lib", "xray", "--nproc-per-node", "2", "--json",
         str(script)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    report = json.loads(proc.stdout)
    assert set(report) >= {"findings", "checked", "not_checked"}
    assert proc.returncode == 1
    finding = next(f for f in report["findings"] if f["id"] == "P03")
    assert set(finding) == {"id", "title", "evidence", "where", "lesson", "certainty"}
    assert finding["where"].startswith(os.path.relpath(script, ROOT))


def test_crash_gives_root_cause_first_and_findings_before_it(capsys) -> None:
    report, status = run_case(CASES / "bad_P03_then_crash.py", capsys)
    assert status == 1 and [f["id"] for f in report["findings"]] == ["P03"]
    assert report["error"].startswith("2 of 2 rank(s) failed. First failure: rank 1, "
                                      "RuntimeError: mat1 and mat2 shapes cannot be multiplied")


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
    assert status == 1, report
    assert "Desync report" in report["error"] and "hang.py" in report["error"]
    assert [(f["id"], f["certainty"]) for f in report["findings"]] == [
        ("P16", "confirmed"), ("S1", "suspected")]
    assert "rank 1 never issued it" in report["findings"][1]["evidence"]
    assert "time.sleep(0.1)" in report["error"]  # the stopped rank's stack


def test_notebook_function() -> None:
    """xray(fn) on a notebook-style function: its finding, and its Run's results."""
    from course_lib import xray

    report = xray(_every_rank_all_data, world_size=2, timeout=60)
    assert report.ids == ["P03"], str(report)
    assert report.findings[0].where.endswith(f"test_xray.py:{_LOADER_LINE}")
    assert report.run.results == [8, 8] and report.exit_status == 1
    assert "P03" in report._repr_html_()


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
