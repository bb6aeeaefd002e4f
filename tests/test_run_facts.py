"""The docs' whole-run numbers (test counts, CI time, .venv size, the doctor's table and time,
each benchmark's output) are the ones in docs/run_facts.json, which
`python -m course_lib run-facts` writes from the runs that measured them, with their date and
load."""

import datetime
import json
import shutil
from pathlib import Path

import pytest

from course_lib.authoring import run_facts

ROOT = Path(__file__).resolve().parents[1]
FACTS = {"ci": {"date": "2026-11-26", "seconds": 1536.4, "load": "4.4 at the start, 2.1 at the end",
                "tests": {"passed": 1022, "failed": 0, "skipped": 1, "notebooks": 48}},
         "venv": {"date": "2026-11-27", "bytes": 1.31e9},
         "doctor": {"date": "2026-11-28", "seconds": 18.6, "load": "7.4 at the start",
                    "table": "T"},
         "bench": {"launch": {"date": "2026-11-26", "load": "1.6 at the start",
                              "output": "| a | b |\n|---|---|"},
                   "xray_cases": {"date": "2026-11-28", "load": "5.0 at the start, 6.0 at the end",
                                  "output": "67 x-ray runs on 2 cores: median 5.1 s"}}}


def test_every_page_quotes_the_committed_run():
    facts = json.loads((ROOT / run_facts.FACTS).read_text())
    for page, text in run_facts.render(ROOT, facts).items():
        assert (ROOT / page).read_text() == text, (
            f"{page} is stale: run .ci/run, then python -m course_lib run-facts (see its --help)")


def test_counts_come_from_the_junit_file(tmp_path):
    (tmp_path / "j.xml").write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.test_a" name="test_one"/>'
        '<testcase classname="tests.test_a" name="test_two"><failure/></testcase>'
        '<testcase classname="tests.test_a" name="test_three"><skipped/></testcase>'
        '<testcase classname="x.notebooks.00_welcome.ipynb" name="00_welcome.ipynb"/>'
        '</testsuite></testsuites>')
    assert run_facts.outcome_counts(tmp_path / "j.xml") == {
        "passed": 2, "failed": 1, "skipped": 1, "notebooks": 1}


def test_the_blocks_say_what_the_facts_hold_with_date_and_load():
    blocks = run_facts.blocks(FACTS)
    ci = blocks[run_facts.CI_BLOCK]
    assert "25 min 36 s" in ci and "1022 passed, 0 failed" in ci
    assert "on 2026-11-26 (a clean clone, set-up included; load average 4.4 at the start, " \
           "2.1 at the end)" in ci
    assert "1.3 GB of disk on 2026-11-27" in blocks[run_facts.VENV_BLOCK]
    assert blocks[run_facts.DOCTOR_BLOCK] == (
        "```\nT\n```\n\nThis run of the doctor took 19 s on the 2-core development machine on "
        "2026-11-28 (load average 7.4 at the start).")
    launch = blocks[run_facts.bench_markers("launch")]
    assert launch == ("`.venv/bin/python benchmarks/launch.py` on the 2-core development "
                      "machine on 2026-11-26 (load average 1.6 at the start):\n\n| a | b |\n"
                      "|---|---|")
    assert blocks[run_facts.bench_markers("xray_cases")].endswith(
        ":\n\n```text\n67 x-ray runs on 2 cores: median 5.1 s\n```")  # printed as text
    assert blocks[run_facts.bench_markers("xray")] == (
        "Not measured yet: `python -m course_lib run-facts --bench xray` runs it.")


def test_a_doctor_without_its_time_says_so():
    facts = {**FACTS, "doctor": {"date": "2026-11-26", "seconds": None, "load": None,
                                 "table": "T"}}
    assert run_facts.blocks(facts)[run_facts.DOCTOR_BLOCK].endswith(
        "The doctor's time on 2026-11-26 was not recorded.")


def course_pages(root: Path) -> None:
    """The pages the command writes, with their markers, and the committed facts."""
    (root / "docs").mkdir()
    shutil.copy(ROOT / run_facts.FACTS, root / run_facts.FACTS)
    for page, markers in run_facts.PAGES.items():
        (root / page).write_text("".join(f"x\n{start}\n{end}\n" for start, end in markers))


def test_the_command_measures_one_part_and_keeps_the_others(tmp_path, monkeypatch):
    course_pages(tmp_path)
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "f").write_bytes(b"0" * 2_500_000)
    monkeypatch.chdir(tmp_path)
    before = json.loads((tmp_path / run_facts.FACTS).read_text())
    assert run_facts.main(["--venv", "venv"]) == 0
    after = json.loads((tmp_path / run_facts.FACTS).read_text())
    assert after["venv"] == {"date": datetime.date.today().isoformat(), "bytes": 2_500_000}
    assert {k: v for k, v in after.items() if k != "venv"} == \
        {k: v for k, v in before.items() if k != "venv"}
    assert "took 0.0 GB of disk" in (tmp_path / "docs/pre-workshop-email.md").read_text()
    with pytest.raises(SystemExit):
        run_facts.main(["--junit", "j.xml"])  # without --ci-seconds


def test_a_benchmark_is_run_and_its_summary_kept_with_its_load(tmp_path, monkeypatch):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "xray_cases.py").write_text(
        "print('  4.1 s  good_a')\nprint('  6.0 s  bad_b')\n"
        "print()\nprint('2 x-ray runs on 2 cores: median 5.0 s')\n")
    monkeypatch.chdir(tmp_path)
    record = run_facts.run_bench("xray_cases")
    assert record["output"] == "2 x-ray runs on 2 cores: median 5.0 s"
    assert record["date"] == datetime.date.today().isoformat()
    assert " at the start, " in record["load"] and record["load"].endswith(" at the end")
    (tmp_path / "benchmarks" / "xray.py").write_text("raise SystemExit('no torchrun')")
    with pytest.raises(RuntimeError, match="benchmarks/xray.py failed"):
        run_facts.run_bench("xray")
