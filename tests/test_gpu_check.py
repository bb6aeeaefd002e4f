"""scripts/gpu-check: which notebook failed and why, the cell a killed one was in, the stacks
of a stalled one (nbwatch), the quick tests' outcome, and the commit line."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from gpu_check import facts, nbwatch, runner, summary  # noqa: E402 - scripts/ is no package path


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
    assert runner.main([str(tmp_path / "out"), "1", "120", "60", str(path)]) == 1
    [record] = json.loads((tmp_path / "out" / "notebooks.json").read_text())
    assert record["first_error"] == "cell 2: ValueError: boom"
    assert not record["ok"]


def write_events(notebook: Path, *events: dict) -> None:
    nbwatch.events_path(notebook).write_text("".join(json.dumps(e) + "\n" for e in events))


def test_a_killed_run_names_the_cell_it_was_in(tmp_path):
    nb = tmp_path / "slow.ipynb"
    write_events(nb, {"t": 100.0, "event": "kernel", "pid": 1},
                 {"t": 101.0, "event": "start", "cell": 2, "source": "x = 1"},
                 {"t": 101.5, "event": "end", "cell": 2, "status": "ok"},
                 {"t": 102.0, "event": "start", "cell": 4, "source": "train(model)"},
                 {"t": 130.0, "event": "killed", "cell": 4, "why": "the cap (30 s)"})
    nbwatch.stacks_path(nb).write_text("===== dump\n")
    assert runner.stop_reason(nb, nbwatch.KILLED, "") == (
        "killed at the check's time cap in cell 4 (running 28 s: `train(model)`); "
        "stacks: slow.stacks.txt")
    assert nbwatch.cell_spans(nbwatch.read_events(nbwatch.events_path(nb))) == [
        (2, 101.0, 101.5), (4, 102.0, None)]


def test_a_run_killed_before_any_cell_says_so(tmp_path):
    nb = tmp_path / "never.ipynb"
    write_events(nb, {"t": 1.0, "event": "killed", "cell": None, "why": "the cap (9 s)"})
    assert runner.stop_reason(nb, nbwatch.KILLED, "") == (
        "killed at the check's time cap before its first cell")


def test_a_stopped_run_names_its_cell_and_reason(tmp_path):
    nb = tmp_path / "stopped.ipynb"
    write_events(nb, {"t": 1.0, "event": "start", "cell": 3, "source": "loop()"},
                 {"t": 9.0, "event": "finished", "status": "stopped",
                  "detail": "CellTimeoutError: A cell timed out"})
    assert runner.stop_reason(nb, 1, "") == (
        "execution stopped in cell 3: CellTimeoutError: A cell timed out")


def test_the_longest_notebooks_start_first():
    paths = [Path("/out/executed/solutions/00_welcome.ipynb"),
             Path("/out/executed/notebooks/14_torchrun.ipynb"),
             Path("/out/executed/notebooks/new_lesson.ipynb")]
    known = runner.run_times(runner.ROOT)["nbmake"]["seconds"]
    assert known["notebooks/14_torchrun.ipynb"] > known["solutions/00_welcome.ipynb"]
    assert runner.longest_first(paths) == [paths[1], paths[0], paths[2]]


SLEEPER = """
import faulthandler, os, signal, sys, time
def {name}():
    time.sleep(120)
if {register}:
    faulthandler.register(signal.SIGUSR1, file=open(sys.argv[1], "a"), all_threads=True)
{spawn}
print("ready", flush=True)
{name}()
"""


def sleeper(tmp_path: Path, name: str, register: bool, spawn: str = "") -> subprocess.Popen:
    """A Python process waiting in function `name`, with faulthandler on SIGUSR1 or not."""
    code = SLEEPER.format(name=name, register=register, spawn=spawn)
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / f"{name}-stack")],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_faulthandler_gives_the_stacks_and_spares_a_process_without_it(tmp_path):
    """The fallback without py-spy: a process with faulthandler on SIGUSR1 (as the kernel and
    course_lib's ranks have) shows its stack; one without it is never sent SIGUSR1 (that
    would kill it) and is named as having none."""
    child = ("import subprocess; kid = subprocess.Popen([sys.executable, '-c', "
             "'import time\\ndef child_waits_here(): time.sleep(120)\\nchild_waits_here()'])")
    parent = sleeper(tmp_path, "parent_waits_here", register=True, spawn=child)
    try:
        [kid] = psutil.Process(parent.pid).children()
        out = tmp_path / "stacks.txt"
        nbwatch.dump_stacks(parent.pid, out, "a test", pyspy=None)
        text = out.read_text()
        assert "parent_waits_here" in text and "(from faulthandler, as no py-spy)" in text
        assert f"--- pid {kid.pid} " in text and "it has no faulthandler on SIGUSR1" in text
        assert kid.is_running() and kid.status() != psutil.STATUS_ZOMBIE
    finally:
        nbwatch.kill_tree(parent.pid)
        parent.wait(10)


@pytest.mark.skipif(nbwatch.find_pyspy() is None, reason="py-spy is not installed here")
def test_py_spy_gives_the_stacks_of_a_process_and_its_children(tmp_path):
    proc = sleeper(tmp_path, "waits_for_py_spy", register=False)
    try:
        out = tmp_path / "stacks.txt"
        nbwatch.dump_stacks(proc.pid, out, "a test", pyspy=nbwatch.find_pyspy())
        text = out.read_text()
        if "py-spy failed" in text:
            pytest.skip(f"py-spy may not attach here: {text.splitlines()[-1]}")
        assert "waits_for_py_spy" in text and "a test" in text
    finally:
        proc.kill()
        proc.wait(10)


def test_the_summary_quotes_each_process_main_thread_from_the_last_dump():
    dump = textwrap.dedent("""\
        ===== 10:00: no progress for 60 s in cell 4 (load average 1.0 1.0 1.0)
        --- pid 1 (sleeping, 1.0 s of CPU): python old
        Thread 1 (idle): "MainThread"
            old (a.py:1)

        ===== 10:01: killed at the cap (300 s) in cell 4 (load average 9.0 8.0 7.0)
        --- pid 7 (sleeping, 2.0 s of CPU): python -m ipykernel_launcher
        Thread 9 (idle): "IOPub"
            select (selectors.py:468)
        Thread 7 (idle): "MainThread"
            wait_for_ranks (launcher.py:10)
            launch (launcher.py:20)
            <module> (123.py:1)
        --- pid 8 (sleeping, 0.5 s of CPU): python -c from multiprocessing.forkserver ...
        (from faulthandler, as no py-spy)
        Current thread 0x01 (most recent call first):
          File "rank_main.py", line 5 in all_reduce
          File "<string>", line 1 in <module>
        --- pid 9 (sleeping, 0.0 s of CPU): python -c from multiprocessing.resource_tracker ...
        (no stack: no py-spy, and it has no faulthandler on SIGUSR1)
        """)
    assert nbwatch.main_threads(dump, frames=2) == textwrap.dedent("""\
        ===== 10:01: killed at the cap (300 s) in cell 4 (load average 9.0 8.0 7.0)
        --- pid 7 (sleeping, 2.0 s of CPU): python -m ipykernel_launcher
            wait_for_ranks (launcher.py:10)
            launch (launcher.py:20)
        --- pid 8 (sleeping, 0.5 s of CPU): python -c from multiprocessing.forkserver ...
            File "rank_main.py", line 5 in all_reduce
            File "<string>", line 1 in <module>
        --- pid 9 (sleeping, 0.0 s of CPU): python -c from multiprocessing.resource_tracker ...
            (no stack: no py-spy, and it has no faulthandler on SIGUSR1)""")


def test_the_summary_shows_a_killed_notebooks_cell_and_stacks(tmp_path):
    nb = tmp_path / "executed" / "notebooks" / "09_x.ipynb"
    nb.parent.mkdir(parents=True)
    executed_notebook(nb, tagged_error=False, untagged_error=False)
    stacks = nbwatch.stacks_path(nb)
    stacks.write_text("===== 10:01: killed\n--- pid 7 (sleeping): kernel\n"
                      "Thread 7 (idle): \"MainThread\"\n    spin (x.py:1)\n    <module> (1.py:1)\n")
    record = runner.judge(nb, 300.0, "killed at the check's time cap in cell 21 (running "
                                      "250 s: `%%ddp`); stacks: 09_x.stacks.txt")
    record.update(stalls=[{"cell": 21, "idle": 60.2}], stacks=str(stacks))
    text = summary.render({}, [record], "not run\nrc=not run", 400, out=tmp_path)
    row = "| notebooks/09_x.ipynb | FAIL | 300 s | killed at the check's time cap in cell 21"
    assert row in text
    assert "no progress (no cell started, ended or printed) for: cell 21: 60 s" in text
    assert "`executed/notebooks/09_x.stacks.txt`" in text and "    spin (x.py:1)" in text
    assert "quick tests: not run (--no-tests)" in text


PYTEST_KILLED = """\
.......................................................................
  15:check_fixed_train: passed in 1.1 s (2 ranks 0.3 s, 4 ranks 0.2 s; limit 60 s a launch)
........................................................................ [ 42%]
..........rc=124
"""

PYTEST_DONE = """\
........................................................................ [100%]
============================= slowest 10 durations =============================
33.31s call     tests/test_checks_lesson14.py::test_check_main[good]
7.10s call     tests/test_checks_lesson13.py::test_shard_to_fit
0.52s setup    tests/test_launch.py::test_warm
=========================== short test summary info ============================
FAILED tests/test_x.py::test_y - AssertionError
1 failed, 1021 passed, 3 skipped in 201.17s (0:03:21)
rc=1
"""


def test_the_quick_tests_outcome_and_their_slowest():
    assert summary.pytest_outcome(PYTEST_KILLED) == (False, "killed at their time limit, "
                                                            "42% done")
    assert summary.pytest_outcome(PYTEST_DONE) == (
        False, "1 failed, 1021 passed, 3 skipped in 201.17s (0:03:21)")
    assert summary.slowest_tests(PYTEST_DONE) == [
        "33.3 s  tests/test_checks_lesson14.py::test_check_main[good] (call)",
        "7.1 s  tests/test_checks_lesson13.py::test_shard_to_fit (call)",
        "0.5 s  tests/test_launch.py::test_warm (setup)"]
    text = summary.render({}, [], PYTEST_DONE, 10)
    assert "- 33.3 s  tests/test_checks_lesson14.py::test_check_main[good] (call)" in text


def test_the_doctor_line_gives_its_verdict():
    report = "check  result  detail\njupyterlab  SKIP  not needed\n\nAll checks passed: ready.\n"
    report += "rc=0"
    assert summary.doctor_verdict(report) == "All checks passed: ready. (rc=0)"


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_commit_comes_only_from_the_projects_own_repository(tmp_path):
    """A copy without .git inside another repository (the GPU run's case: git found the
    folder around it) is 'not a git checkout'; a checkout gives its own commit."""
    git(tmp_path, "init", "-q")
    (tmp_path / "other.txt").write_text("another project\n")
    git(tmp_path, "add", "other.txt")
    git(tmp_path, "commit", "-q", "-m", "other")
    copy = tmp_path / "work" / "course"
    copy.mkdir(parents=True)
    (copy / "README.md").write_text("the course\n")
    assert facts.project_commit(copy) == "not a git checkout"
    git(copy, "init", "-q")
    git(copy, "add", "README.md")
    git(copy, "commit", "-q", "-m", "course")
    assert facts.project_commit(copy) == git(copy, "rev-parse", "--short", "HEAD")
    (copy / "README.md").write_text("changed\n")
    assert facts.project_commit(copy).endswith(" with uncommitted changes")


def sleepy_notebook(path: Path, seconds: float) -> Path:
    """Cell 2 prints; cell 3 waits `seconds` in a named function; cell 4 prints."""
    cells = [nbformat.v4.new_markdown_cell("# a notebook that waits"),
             new_code_cell("import time\nprint('first')"),
             new_code_cell(f"def waits_in_cell_three():\n    time.sleep({seconds})\n"
                           "waits_in_cell_three()"),
             new_code_cell("print('last')")]
    nbformat.write(new_notebook(cells=cells), path)
    return path


@pytest.mark.kernel  # starts a Jupyter kernel
def test_a_notebook_killed_at_a_small_cap_names_the_cell_and_keeps_what_ran(tmp_path):
    nb = sleepy_notebook(tmp_path / "sleepy.ipynb", 600)
    # The cap counts from the start, kernel start included: 40 s leaves it 30 s at load 25+.
    record = runner.run_one(nb, time.monotonic() + 40, stall_s=15)
    assert not record["ok"]
    assert record["first_error"].startswith("killed at the check's time cap in cell 3 "
                                            "(running "), record
    assert "`def waits_in_cell_three():`); stacks: sleepy.stacks.txt" in record["first_error"]
    assert 3 in [stall["cell"] for stall in record["stalls"]]
    stacks = Path(record["stacks"]).read_text()
    assert "killed at the cap" in stacks and "waits_in_cell_three" in stacks
    saved = nbformat.read(nb, as_version=4)
    assert saved.cells[1].outputs[0]["text"] == "first\n"  # saved after its cell
    assert "iopub.execute_input" in saved.cells[2].metadata["execution"]  # record_timing
    kernel = next(e["pid"] for e in nbwatch.read_events(nbwatch.events_path(nb))
                  if e["event"] == "kernel")
    assert not psutil.pid_exists(kernel) or psutil.Process(kernel).status() == "zombie"


@pytest.mark.kernel  # starts a Jupyter kernel
def test_a_stall_is_dumped_from_faulthandler_and_the_run_goes_on(tmp_path):
    """Without py-spy the kernel's stack still shows where it waited (faulthandler,
    registered by nbwatch on SIGUSR1), and a notebook that waits, then goes on, passes."""
    nb = sleepy_notebook(tmp_path / "slow.ipynb", 6)
    done = subprocess.run([sys.executable, str(runner.NBWATCH), str(nb), "--stall", "2",
                           "--no-py-spy"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    events = nbwatch.read_events(nbwatch.events_path(nb))
    # Under load the kernel's start may be a stall too: the watchdog counts from the start.
    assert 3 in [e["cell"] for e in events if e["event"] == "stall"]
    assert [(n, end is not None) for n, _, end in nbwatch.cell_spans(events)] == [
        (2, True), (3, True), (4, True)]
    stacks = nbwatch.stacks_path(nb).read_text()
    assert "(from faulthandler, as no py-spy)" in stacks and "waits_in_cell_three" in stacks
    assert nbformat.read(nb, as_version=4).cells[3].outputs[0]["text"] == "last\n"
