"""The x-ray's case table: every script of tests/xray_cases/ through the command line.

A case declares its verdict in its leading comment lines:
    # expect: P04 P16        the confirmed findings (`P10?`: a suspicion; `none`: no finding)
    # expect: cannot judge   a script that cannot train here: no finding, nothing checked,
    # first line: Cannot ... the report's first line starts so ({script}: the path shown;
    #   a line that starts "#   " continues the one above)
    # checks: P03 P04        (a correct case) rules its run must list as checked, not found
    # xray: --nproc-per-node 3    options for the x-ray;  # args: 2 1   the script's own
Every buggy case shows exactly its findings (confirmed and suspected), every correct one
none, and every run lists each rule exactly once: found, checked, or not judged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from course_lib.xray import cli
from course_lib.xray.report import CLEAN, CONFIRMED, NOT_JUDGED

CASES = Path(__file__).parent / "xray_cases"
CANNOT = "cannot judge"


def header(path: Path, key: str) -> str:
    """The text of a case's `# key: ...` line among its leading comment lines, with the
    lines after it that continue it (`#   more`), joined by spaces ("" if none)."""
    found: list[str] = []
    for line in path.read_text().splitlines():
        if not line.startswith("# "):
            break
        if found and line.startswith("#   "):
            found.append(line[4:].strip())
        elif found:
            break
        elif line.startswith(f"# {key}:"):
            found.append(line.split(":", 1)[1].strip())
    return " ".join(found)


def expected(path: Path) -> tuple[set[str], set[str]]:
    """The ids a case expects confirmed and suspected (`P10?`); none for `none` and for a
    script that cannot be judged."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect:"), f"{path.name}: first line must be '# expect: ...'"
    words = header(path, "expect").split()
    if words in (["none"], CANNOT.split()):
        return set(), set()
    return {w for w in words if not w.endswith("?")}, {w[:-1] for w in words if w.endswith("?")}


def rule_ids() -> set[str]:
    from course_lib.xray.detectors import in_report_order

    return {r.id for r in in_report_order()}


def torch_cuda_count() -> int:
    import torch

    return torch.cuda.device_count()


def run_case(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict, int]:
    status = cli.main(["--json", "--timeout", "60", *header(path, "xray").split(), str(path),
                       *header(path, "args").split()])
    return json.loads(capsys.readouterr().out), status


def listed_ids(report: dict) -> list[str]:
    """Every id the report names: findings, checked ("P03 ..."), not judged ("P03: ...")."""
    return ([f["id"] for f in report["findings"]] + [c.split()[0] for c in report["checked"]]
            + [u.split(":")[0] for u in report["not_checked"]])


@pytest.mark.parametrize("path", sorted(CASES.glob("*.py")), ids=lambda p: p.stem)
def test_case(path: Path, capsys, tmp_path, monkeypatch) -> None:
    cannot = header(path, "expect") == CANNOT
    if cannot and torch_cuda_count() > 0:
        pytest.skip("written for a machine without a GPU")
    monkeypatch.chdir(tmp_path)  # the checkpoint cases write their files here
    report, status = run_case(path, capsys)
    shown = json.dumps(report, indent=1)
    assert sorted(listed_ids(report)) == sorted(rule_ids()), shown  # each rule once
    if cannot:
        first = header(path, "first line").replace("{script}", str(path))
        assert report.get("cause", "").startswith(first), shown
        assert status == NOT_JUDGED and report["findings"] == [] and report["checked"] == []
        return
    assert "cause" not in report, shown  # a script that trains here is judged
    want, maybe = expected(path)
    assert {f["id"] for f in report["findings"] if f["certainty"] == "confirmed"} == want, shown
    assert {f["id"] for f in report["findings"] if f["certainty"] == "suspected"} == maybe, shown
    assert status == (CONFIRMED if want else CLEAN), shown
    if not want and not maybe:  # a correct script: its named rules were checked, not found
        checked = {line.split()[0] for line in report["checked"]}
        assert set(header(path, "checks").split()) <= checked, shown
    for f in report["findings"]:
        assert f["evidence"] and f["lesson"].startswith("notebooks/"), f


def test_every_rule_has_a_buggy_and_a_correct_case() -> None:
    """Each rule is expected by a bad_<ID>_ case and checked by a good_ case (`# checks:`,
    verified when test_case runs it); no case names an id without a rule."""
    found = {p: set().union(*expected(p)) for p in CASES.glob("bad_*.py")}
    bad = {pid for p, ids in found.items() for pid in ids & set(p.stem.split("_"))}
    good = {pid for p in CASES.glob("good_*.py") for pid in header(p, "checks").split()}
    rules = rule_ids()
    assert not rules - bad, f"rules without a bad_<ID>_ case: {sorted(rules - bad)}"
    assert not rules - good, f"rules no correct case checks: {sorted(rules - good)}"
    named = set().union(*found.values(), good)
    assert named <= rules, f"cases name unknown rules: {sorted(named - rules)}"


def test_the_table_holds_scripts_that_cannot_run_here_each_with_its_first_line() -> None:
    """Issue 41: at least 8 scripts that cannot train on a CPU machine, each declaring the
    report's expected first line; every case file is bad_, good_ or cannot_."""
    cannot = [p for p in CASES.glob("*.py") if header(p, "expect") == CANNOT]
    assert len(cannot) >= 8 and all(header(p, "first line") for p in cannot)
    assert {p.name.split("_")[0] for p in CASES.glob("*.py")} == {"bad", "good", "cannot"}
    assert all(p.name.startswith("cannot_") for p in cannot)
