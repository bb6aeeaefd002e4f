"""Every way a rank can fail ends in one clear DistributedError, with no worker left."""

import os
import re
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
from procs import alive

from course_lib import DistributedError, launch
from course_lib.launching import ranks
from course_lib.launching.headline import headline_first
from course_lib.launching.payload import UnpicklableError


def _fails_on_rank_1():
    print("about to fail")
    if dist.get_rank() == 1:
        raise ValueError("bad batch on rank 1")
    dist.all_reduce(torch.ones(1))


def test_exception_on_one_rank_names_it_first_with_learner_frames():
    with pytest.raises(DistributedError) as info:
        launch(_fails_on_rank_1, 2, backend="gloo", echo=False)
    err = info.value
    first = err.failures[0]
    assert (first.rank, first.kind, first.error_type) == (1, "exception", "ValueError")
    assert "bad batch on rank 1" in str(err) and "First failure: rank 1" in str(err)
    assert 'raise ValueError("bad batch on rank 1")' in first.traceback  # source shown
    assert "_fails_on_rank_1" in first.traceback.splitlines()[1]  # learner's frame first
    assert "course_lib/launching" not in first.traceback
    assert first.output_tail == ["about to fail"]
    assert isinstance(err, RuntimeError)


def _kill_self(how):
    if dist.get_rank() == 1:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "abort":
            os.abort()
        else:
            sys.exit(3)
    dist.all_reduce(torch.ones(1))


@pytest.mark.parametrize("how, kind, expected", [
    ("kill", "signal", "SIGKILL"), ("abort", "signal", "SIGABRT"), ("exit", "exit", "exit code 3"),
])
def test_a_rank_that_dies_is_named_with_its_signal_or_exit_code(how, kind, expected):
    with pytest.raises(DistributedError) as info:
        launch(_kill_self, 2, args=(how,), backend="gloo", echo=False)
    first = info.value.failures[0]
    assert first.rank == 1 and first.kind == kind
    assert expected in first.summary or expected in str(info.value)


def test_sys_exit_zero_counts_as_success():
    assert launch(lambda: sys.exit(0), 2, backend="gloo", echo=False).results == [None, None]


def _hangs_on_rank_1():
    dist.barrier()  # both ranks are up, so rank 0 is surely inside the all-reduce at the timeout
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.all_reduce(torch.ones(1))


def test_hang_ends_at_the_timeout_with_every_running_ranks_stack():
    start = time.monotonic()
    with pytest.raises(DistributedError) as info:
        launch(_hangs_on_rank_1, 2, timeout=5, backend="gloo", echo=False)
    assert time.monotonic() - start < 5 + 10  # a guard against hanging, not a speed target
    err = info.value
    assert err.timed_out and "Timed out after 5 s" in str(err)
    hung = err.failures[0]
    assert (hung.rank, hung.kind) == (1, "timeout")
    assert "_hangs_on_rank_1" in hung.stack and "time.sleep(600)" in hung.stack
    assert "course_lib-kernel-watch" not in hung.stack and "forkserver" not in hung.stack


def _spin_forever():
    while True:
        pass


def test_all_ranks_stuck_in_python_each_show_their_stack():
    with pytest.raises(DistributedError) as info:
        launch(_spin_forever, 2, timeout=2, backend="gloo", echo=False)
    assert sorted(f.rank for f in info.value.failures) == [0, 1]
    assert all("_spin_forever" in f.stack for f in info.value.failures)


def _fail_fast_or_spin():
    if dist.get_rank() == 0:
        raise KeyError("rank 0 gives up")
    while True:
        pass


def test_after_a_failure_the_other_ranks_are_stopped_with_their_stacks():
    start = time.monotonic()
    with pytest.raises(DistributedError) as info:
        launch(_fail_fast_or_spin, 2, timeout=60, backend="gloo", echo=False)
    assert time.monotonic() - start < 20  # did not wait for the 60 s timeout
    kinds = {f.rank: f.kind for f in info.value.failures}
    assert kinds == {0: "exception", 1: "stopped"}
    assert "_fail_fast_or_spin" in info.value.failures[1].stack


def _dataloader_then_fail(folder: str):
    """Start two persistent DataLoader workers, say so, wait until the test has seen them;
    then rank 1 fails and rank 0 hangs, so the launcher stops rank 0 with its workers."""
    from torch.utils.data import DataLoader

    loader = DataLoader(list(range(100)), batch_size=2, num_workers=2, persistent_workers=True)
    for _ in loader:
        pass
    Path(folder, f"rank-{os.getpid()}").touch()
    while not Path(folder, "seen").exists():
        time.sleep(0.05)
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails")
    time.sleep(600)


def _watch(folder: Path, started: dict[int, set[int]]) -> None:
    """Once both ranks have started their workers, record each rank's child processes (the
    DataLoader workers, and the forkserver that starts them), then tell the ranks to go on."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ranks = {int(f.name.split("-")[1]) for f in folder.glob("rank-*")}
        if len(ranks) == 2:
            started.update({pid: {c.pid for c in psutil.Process(pid).children(recursive=True)}
                            for pid in ranks})
            Path(folder, "seen").touch()
            return
        time.sleep(0.05)


def test_dataloader_processes_die_with_their_rank(tmp_path):
    started: dict[int, set[int]] = {}
    watcher = threading.Thread(target=_watch, args=(tmp_path, started), daemon=True)
    watcher.start()
    with pytest.raises(DistributedError) as info:
        launch(_dataloader_then_fail, 2, args=(str(tmp_path),), backend="gloo", timeout=60,
               echo=False)
    watcher.join()
    # the positive control: while the ranks ran, the test saw each one's children, its two
    # workers at least (psutil lists live processes only), so the test below could fail
    assert len(started) == 2 and all(len(c) >= 2 for c in started.values()), started
    assert {f.rank: f.kind for f in info.value.failures} == {1: "exception", 0: "stopped"}
    children = set().union(*started.values())
    deadline = time.monotonic() + 5
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(children), f"DataLoader processes {alive(children)} outlived their rank"


LOCK = threading.Lock()


def _uses_lock():
    with LOCK:
        return 1


def test_unpicklable_function_fails_before_any_worker_starts(monkeypatch):
    def no_start(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(ranks, "start_worker", no_start)
    with pytest.raises(UnpicklableError) as info:
        launch(_uses_lock, 2, backend="gloo")
    message = str(info.value)
    assert "'LOCK'" in message and "lock" in message and "inside the function" in message
    assert isinstance(info.value, TypeError)


def test_unpicklable_argument_is_named(monkeypatch):
    monkeypatch.setattr(ranks, "start_worker", None)
    with pytest.raises(UnpicklableError, match="argument 1"):
        launch(lambda a, b: None, 2, args=(1, threading.Lock()), backend="gloo")


def test_unpicklable_result_names_the_rank_and_what_to_return():
    with pytest.raises(DistributedError) as info:
        launch(lambda: threading.Lock() if dist.get_rank() == 1 else 0, 2, backend="gloo",
               echo=False)
    first = info.value.failures[0]
    assert first.rank == 1 and "cannot be sent back" in first.message
    assert "state_dict" in first.message


CELL_SOURCE = "def boom():\n    if dist.get_rank() == 1:\n        raise KeyError('from the cell')\n"


def test_a_cell_functions_traceback_keeps_its_file_and_source_line():
    """A function compiled as IPython compiles a cell keeps its file name and line through
    the launch (cloudpickle 3.1.3 renames every file '<dynamic-code>')."""
    import linecache

    filename = "/tmp/ipykernel_0/course-test-cell.py"
    linecache.cache[filename] = (len(CELL_SOURCE), None, CELL_SOURCE.splitlines(True), filename)
    namespace = {"dist": dist}
    exec(compile(CELL_SOURCE, filename, "exec"), namespace)
    with pytest.raises(DistributedError) as info:
        launch(namespace["boom"], 2, backend="gloo", echo=False)
    traceback = info.value.failures[0].traceback
    assert f'File "{filename}", line 3, in boom' in traceback
    assert "raise KeyError('from the cell')" in traceback
    assert "<dynamic-code>" not in traceback


CUDNN_SOURCE = """
def deterministic_cudnn():
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    return torch.backends.cudnn.deterministic
"""


def test_a_notebook_function_that_sets_cudnn_flags_launches():
    """torch.backends.cudnn is an instance of a module subclass, which cloudpickle alone
    cannot pickle ("cannot pickle 'CudnnModule'"); it goes by reference."""
    namespace = {"torch": torch, "__name__": "__main__"}  # by value, as from a notebook
    exec(CUDNN_SOURCE, namespace)
    run = launch(namespace["deterministic_cudnn"], 2, backend="gloo", echo=False)
    assert run.results == [True, True]


def _rank_0_returns_rank_1_raises():
    if dist.get_rank() == 1:
        raise ValueError("rank 1 failed")
    return {"rank": 0}


def test_a_failed_launch_keeps_the_results_of_the_ranks_that_returned():
    with pytest.raises(DistributedError) as info:
        launch(_rank_0_returns_rank_1_raises, 2, backend="gloo", echo=False)
    assert info.value.run.results == [{"rank": 0}, None]
    assert info.value.run.returned == [0]
    assert launch(lambda: None, 2, backend="gloo", echo=False).returned == [0, 1]


# -- how IPython shows the error (issue 36: read it from the top) ------------------------------

def test_in_ipython_the_error_reads_from_its_headline_down():
    """IPython renders _render_traceback_(): the headline, the root cause's traceback, the
    desync table, the other ranks, then the line that called launch; no launcher frame."""
    with pytest.raises(DistributedError) as info:
        launch(_fails_on_rank_1, 2, backend="gloo", echo=False)
    err = info.value
    shown = err._render_traceback_()
    assert shown[0] == f"DistributedError: {err.headline.splitlines()[0]}"
    text = "\n".join(shown)
    order = ["--- rank 1: ValueError", "Desync report", "--- rank 0:", "Raised from your code:",
             "launch(_fails_on_rank_1, 2"]
    assert [text.index(part) for part in order] == sorted(text.index(p) for p in order)
    assert "course_lib" + os.sep not in text  # the launcher's frames: none
    plain = "".join(traceback.format_exception(err))  # scripts and pytest: the whole story
    assert os.path.join("launching", "launcher.py") in plain


def test_headline_first_shows_any_error_from_its_message_and_the_learner_s_line():
    def check_stub():
        raise headline_first(NotImplementedError("f() is not written yet: replace its TODO"))

    with pytest.raises(NotImplementedError) as info:
        check_stub()
    shown = info.value._render_traceback_()
    assert shown[0] == "NotImplementedError: f() is not written yet: replace its TODO"
    assert any("raise headline_first(" in line for line in shown)


def not_read_from_the_top(output: dict) -> str:
    """Why an executed cell's error output does not start with its headline ("" when it
    does, or when no course_lib frame is shown at all: an error of torch's in the cell)."""
    lines = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(output["traceback"])).splitlines()
    headline = f"{output['ename']}: {str(output['evalue']).splitlines()[0]}"
    if lines[:1] == [headline] or not any("course_lib" + os.sep in ln for ln in lines):
        return ""
    return f"its first line is {lines[0]!r}, not {headline!r}"


FAILING_CELLS = {
    "exception": 'def train():\n    if dist.get_rank() == 1:\n        raise ValueError("bad")\n'
                 '    dist.all_reduce(torch.ones(1))\n\nlaunch(train, 2, backend="gloo")',
    "timeout": "import time\n\ndef stuck():\n    time.sleep(60)\n\n"
               'launch(stuck, 2, timeout=3, backend="gloo")',
    "bad input": 'launch(lambda: 1, world_size=0, backend="gloo")',
}


@pytest.mark.kernel
def test_an_executed_notebook_s_launch_errors_start_with_their_headline():
    import nbformat
    from nbclient import NotebookClient

    cells = [nbformat.v4.new_code_cell("import torch, torch.distributed as dist\n"
                                       "from course_lib import launch")]
    cells += [nbformat.v4.new_code_cell(code, metadata={"tags": ["raises-exception"]})
              for code in FAILING_CELLS.values()]
    nb = nbformat.v4.new_notebook(cells=cells)
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    errors = [o for cell in nb.cells[1:] for o in cell.outputs if o.output_type == "error"]
    assert [e.ename for e in errors] == ["DistributedError", "DistributedError", "ValueError"]
    assert [not_read_from_the_top(e) for e in errors] == [""] * len(errors)
    assert "Cell In[" in "\n".join(errors[0].traceback)  # the cell's line, named as IPython does
