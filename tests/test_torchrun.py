"""teach/torchrun.py: commands streamed into the cell, failures quoted, nothing left behind."""

import signal
import sys
import time

import pytest

from course_lib.teach.torchrun import (
    TorchrunFailed,
    error_lines,
    free_ports,
    node_gpus,
    plot_jobs,
    run,
    start,
    wait,
)

PY = f"{sys.executable} -c"


def test_run_streams_each_line_as_it_comes(capsys):
    job = run(f'{PY} "print(1, flush=True); import time; time.sleep(0.3); print(2)"')
    assert job.lines == ["1", "2"] and job.process.returncode == 0
    assert capsys.readouterr().out == "1\n2\n"


def test_two_jobs_are_labelled_and_a_failure_quotes_its_error(capsys):
    ok = start(f'{PY} "print(\'fine\')"', "node 0")
    bad = start(f'{PY} "raise ValueError(\'wrong port\')"', "node 1")
    quoted = r"node 1: exit code 1 after .* s\n.*ValueError: wrong port"
    with pytest.raises(TorchrunFailed, match=quoted):
        wait(ok, bad)
    out = capsys.readouterr().out
    assert "[node 0] fine" in out and "[node 1] ValueError: wrong port" in out


def test_a_timeout_kills_the_job_and_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); print('started', flush=True); "
            "time.sleep(60)")
    start_time = time.monotonic()
    with pytest.raises(TorchrunFailed, match="still running after 2 s, killed"):
        run([sys.executable, "-c", code], timeout=2)
    assert time.monotonic() - start_time < 5
    child = int(pidfile.read_text())
    time.sleep(0.2)
    assert not alive(child)


def alive(pid):
    """Running, not gone and not a zombie (an orphan that nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_helpers():
    a, b = free_ports(2)
    assert a != b
    lines = ["x", '  File "f", line 1', "RuntimeError: boom", "frame #1: Error"]
    assert error_lines(lines) == ["RuntimeError: boom"]
    assert error_lines(["a", "b"], most=1) == ["b"]
    jobs = [run(f'{PY} "pass"', echo=False)]
    assert plot_jobs(jobs, "one job").axes[0].get_title() == "one job"


def test_stop_on_failure_ends_the_peers_of_a_failed_job():
    """A node that failed leaves its peers waiting for it: wait() ends them too."""
    bad = start(f'{PY} "raise SystemExit(3)"', "node 1")
    waiting = start(f'{PY} "import time; time.sleep(60); print(\'finished\')"', "node 0")
    with pytest.raises(TorchrunFailed, match="node 1: exit code 3"):
        wait(waiting, bad, timeout=90, echo=False, stop_on_failure=True)
    assert waiting.process.returncode == -signal.SIGKILL and "finished" not in waiting.lines


def test_node_gpus_gives_each_simulated_node_its_own_gpu_or_none():
    import torch

    want = "1" if torch.cuda.device_count() >= 2 else ""
    assert node_gpus(1, 2) == {"CUDA_VISIBLE_DEVICES": want}
