"""Ranks started ahead (launching/standby.py): the next launch finds them ready, and every
guarantee of a fresh launch still holds (issue 38)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch
import torch.distributed as dist
from procs import alive

from course_lib import DistributedError, launch
from course_lib.launching import standby


@pytest.fixture(autouse=True)
def ready_ranks(monkeypatch):
    """Ready ranks on, started as soon as a launch ends; none left after the test."""
    monkeypatch.setenv("COURSE_READY_RANKS", "1")
    monkeypatch.setattr(standby, "IDLE_S", 0.0)
    yield
    standby.discard()


def ready_pids(timeout: float = 30) -> list[int]:
    """The pids of the ranks waiting now, once every one of them said it is ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = standby._ready
        if ready is not None and all(w.messages.poll() for w in ready.workers):
            return [w.process.pid for w in ready.workers]
        time.sleep(0.05)
    raise AssertionError("no ready ranks appeared")


def pid_and_draw():
    return os.getpid(), torch.rand(1).item()


def test_the_next_launch_runs_on_the_ranks_started_for_it():
    first = launch(pid_and_draw, 2, echo=False)
    waiting = ready_pids()
    second = launch(pid_and_draw, 2, echo=False)
    assert [pid for pid, _ in second.results] == waiting
    assert not {pid for pid, _ in first.results} & set(waiting)  # new processes every time
    assert all(t["started"] <= t["ready"] <= t["result"] for t in second.timings)


def test_ready_ranks_draw_fresh_random_numbers():
    launch(pid_and_draw, 2, echo=False)
    draws = []
    for _ in range(3):
        ready_pids()
        draws += [draw for _, draw in launch(pid_and_draw, 2, echo=False).results]
    assert len(set(draws)) == len(draws)  # no two ranks, no two launches alike


STATE = {"calls": 0}


def count_calls():
    STATE["calls"] += 1
    return STATE["calls"]


def test_nothing_is_left_from_the_last_cell():
    launch(count_calls, 2, echo=False)
    ready_pids()
    assert launch(count_calls, 2, echo=False).results == [1, 1]


@pytest.mark.parametrize("change", [
    dict(world_size=3), dict(env={"COURSE_TEST_X": "1"}), dict(timeout=20),
    dict(desync_report=False),
])
def test_a_launch_that_asks_for_other_ranks_starts_its_own(change):
    launch(pid_and_draw, 2, echo=False)
    waiting = ready_pids()
    args = {"world_size": 2, **change}
    run = launch(pid_and_draw, echo=False, **args)
    assert not {pid for pid, _ in run.results} & set(waiting)
    assert not alive(set(waiting))


def test_a_variable_set_in_the_kernel_reaches_the_ranks(monkeypatch):
    launch(pid_and_draw, 2, echo=False)
    ready_pids()
    monkeypatch.setenv("TORCH_COURSE_TEST", "set in a cell")
    assert launch(os.environ.get, 2, args=("TORCH_COURSE_TEST",), echo=False).results == [
        "set in a cell"] * 2


def test_fresh_starts_new_ranks_and_leaves_none_ready():
    launch(pid_and_draw, 2, echo=False)
    waiting = ready_pids()
    run = launch(pid_and_draw, 2, echo=False, fresh=True)
    assert not {pid for pid, _ in run.results} & set(waiting)
    time.sleep(0.5)
    assert standby._ready is None and not alive(set(waiting))


def test_waiting_ranks_use_no_cpu():
    launch(pid_and_draw, 4, echo=False)
    procs = [psutil.Process(pid) for pid in ready_pids()]
    time.sleep(0.5)  # past the last of their set-up
    before = [sum(p.cpu_times()[:2]) for p in procs]
    time.sleep(3)
    used = [sum(p.cpu_times()[:2]) - b for p, b in zip(procs, before)]
    assert max(used) < 0.1, used


def fail_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("bad batch")
    t = torch.ones(1)
    dist.all_reduce(t)


def test_errors_and_the_desync_report_are_the_same_on_ready_ranks():
    launch(pid_and_draw, 2, echo=False)
    ready_pids()
    with pytest.raises(DistributedError) as info:
        launch(fail_on_rank_1, 2, echo=False)
    assert info.value.failures[0].rank == 1
    assert "ValueError: bad batch" in str(info.value)
    assert info.value.desync is not None


def wait_forever():
    time.sleep(600)


def test_a_hang_on_ready_ranks_ends_at_the_timeout_with_stacks():
    launch(pid_and_draw, 2, echo=False, timeout=5)
    ready_pids()
    with pytest.raises(DistributedError) as info:
        launch(wait_forever, 2, echo=False, timeout=5)
    assert info.value.timed_out
    assert all("wait_forever" in f.stack for f in info.value.failures)


KERNEL = textwrap.dedent("""
    import os, sys, time
    os.environ["COURSE_READY_RANKS"] = "1"
    from course_lib import launch
    from course_lib.launching import standby
    standby.IDLE_S = 0.0
    launch(os.getpid, 2, echo=False)
    while standby._ready is None or not all(w.messages.poll() for w in standby._ready.workers):
        time.sleep(0.05)
    print(" ".join(str(w.process.pid) for w in standby._ready.workers), flush=True)
    time.sleep(600)
""")


def test_ready_ranks_end_with_their_kernel():
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL], stdout=subprocess.PIPE, text=True)
    try:
        pids = {int(p) for p in kernel.stdout.readline().split()}
        assert len(pids) == 2 and len(alive(pids)) == 2
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.wait(timeout=10)
        deadline = time.monotonic() + 5
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pids), f"ready ranks {alive(pids)} outlived their kernel"
    finally:
        kernel.kill()
