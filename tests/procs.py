"""Find worker processes left behind: every worker (and its DataLoader children) is a fork
of a multiprocessing forkserver, so it carries the forkserver's command line."""

from __future__ import annotations

import multiprocessing.forkserver
import time

import psutil

MARKER = "from multiprocessing.forkserver import main"


def forkserver_processes() -> set[int]:
    """Pids of every process (forkservers and their forks) with the forkserver command line."""
    pids = set()
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if MARKER in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            pids.add(proc.pid)
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
