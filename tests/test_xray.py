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
