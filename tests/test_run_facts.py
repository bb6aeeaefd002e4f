"""The docs' whole-run numbers (test counts, CI time, .venv size, doctor table) are the ones
in docs/run_facts.json, which `python -m course_lib run-facts` writes from a run."""

import json
from pathlib import Path

from course_lib.authoring import run_facts

ROOT = Path(__file__).resolve().parents[1]


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


def test_the_blocks_say_what_the_facts_hold():
    facts = {"date": "2026-11-26", "ci_seconds": 1536.4, "venv_bytes": 1.31e9, "doctor": "T",
             "tests": {"passed": 1022, "failed": 0, "skipped": 1, "notebooks": 48}}
    texts = run_facts.blocks(facts).values()
    assert "25 min 36 s" in "".join(texts) and "1022 passed" in "".join(texts)
    assert "1.3 GB" in "".join(texts) and "```\nT\n```" in texts
