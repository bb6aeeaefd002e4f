"""Interrupting a launch, or killing its kernel, leaves no worker behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import alive

pytestmark = pytest.mark.kernel  # a kernel or a cold Python process: not in --quick

SCRIPT = Path(__file__).with_name("interrupt_script.py")


def _start(tmp_path, rounds):
    for i in range(rounds):
        (tmp_path / str(i)).mkdir()
    (tmp_path / "tmp").mkdir()  # the script's own temporary folder
    return subprocess.Popen([sys.executable, str(SCRIPT), str(tmp_path), str(rounds)],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})


def _worker_pids(folder: Path, timeout: float = 60) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = list(folder.glob("rank*.pid"))
        if len(files) == 2 and all(f.read_text() for f in files):
            return {int(f.read_text()) for f in files}
        time.sleep(0.05)
    raise AssertionError("workers did not start")


def _gone_within(pids: set[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_sigint_stops_workers_and_interrupting_works_again(tmp_path):
    proc = _start(tmp_path, rounds=2)
    try:
        for i in range(2):
            pids = _worker_pids(tmp_path / str(i))
            proc.send_signal(signal.SIGINT)
            assert proc.stdout.readline().strip() == f"interrupted {i}"
            assert _gone_within(pids, 3), f"workers {alive(pids)} outlived the interrupt"
            assert proc.stdout.readline().strip() == "usable [0, 1]"
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_workers_exit_when_their_kernel_dies(tmp_path):
    proc = _start(tmp_path, rounds=1)
    try:
        pids = _worker_pids(tmp_path / "0")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _gone_within(pids, 5), f"workers {alive(pids)} outlived their kernel"
        assert not list((tmp_path / "tmp").glob("course_lib-*")), "launch folder left behind"
    finally:
        proc.kill()
