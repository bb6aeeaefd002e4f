"""Find worker processes left behind: every worker (and its DataLoader children) is a fork
of a multiprocessing forkserver, so it carries the forkserver's command line, and the
environment of the process that started the forkserver: this test session's tag."""

from __future__ import annotations

import multiprocessing.forkserver
import os
import time
import uuid

import psutil

MARKER = "from multiprocessing.forkserver import main"
SESSION_VAR = "COURSE_TEST_SESSION"


def _session_tag() -> str:
    """This test process's tag, inherited by every process it starts. Under pytest-xdist
    the workers inherit the controller's tag, so each adds its own name (gw0, gw1...):
    a worker then counts only its own tests' ranks, never another worker's."""
    tag = os.environ.get(SESSION_VAR) or uuid.uuid4().hex
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and not tag.endswith(f"-{worker}"):
        tag = f"{tag}-{worker}"
    return tag


os.environ[SESSION_VAR] = _session_tag()


def forkserver_processes() -> set[int]:
    """Pids of this session's forkservers and their forks (other sessions' are ignored)."""
    pids = set()
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if (MARKER in " ".join(proc.info["cmdline"] or [])
                    and proc.info["status"] != psutil.STATUS_ZOMBIE
                    and proc.environ().get(SESSION_VAR) == os.environ[SESSION_VAR]):
                pids.add(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return pids


def current_forkserver() -> int | None:
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)


def leftover_workers(before: set[int], wait: float = 3.0) -> set[int]:
    """Forkserver forks that appeared since `before` and are still alive after `wait` s."""
    deadline = time.monotonic() + wait
    while True:
        extra = forkserver_processes() - before - {current_forkserver()}
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.1)


def alive(pids: set[int]) -> set[int]:
    """The pids still running (zombies count as gone)."""
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out
