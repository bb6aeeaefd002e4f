"""A clean stop on preemption when DataLoader workers get the SIGTERM too: torchrun (and
lesson 11's `faults.terminate_after`) sends it to each rank's whole process group. The workers
ignore it, and the rank's own handler decides (lesson 11)."""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader


def ignore_sigterm(worker_id: int) -> None:
    """A DataLoader `worker_init_fn` for a job that stops cleanly on SIGTERM. torchrun
    sends SIGTERM to each rank's whole process group, DataLoader workers included; a worker
    dies of it by default (silently: PyTorch's handler re-raises it), and the rank's next
    batch then fails ("DataLoader worker ... exited unexpectedly") before the rank can save.
    The worker ignores it, and lets go of one held back by `iter_holding_sigterm`; the
    rank's own handler decides, and the workers end with the rank."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def worker_start_method(loader: DataLoader) -> str | None:
    """How `loader` starts its workers ("fork", "spawn", "forkserver"), or None without
    workers: its `multiprocessing_context`, else this process's default (Linux: "fork" up
    to Python 3.13, "forkserver" from 3.14; macOS: "spawn")."""
    if loader.num_workers == 0:
        return None
    context = loader.multiprocessing_context
    if context is None:
        return multiprocessing.get_start_method()
    return context if isinstance(context, str) else context.get_start_method()


def iter_holding_sigterm(loader: DataLoader) -> Iterator[Any]:
    """iter(loader) with SIGTERM held back while it starts the workers. PyTorch gives each
    new worker a SIGTERM handler of its own (it dies of a SIGTERM that its parent did not
    send: torch/csrc/DataLoader.cpp, handler_SIGTERM) before `worker_init_fn` runs, so a
    SIGTERM in that moment kills the worker whatever the init function does. Held back, it
    stays pending: a worker inherits the blocked mask and drops it in `ignore_sigterm`, and
    this rank's handler runs as soon as the workers have started.

    Refuses a loader whose workers start from a forkserver (Python 3.14's default on
    Linux): they are the forkserver's children, not the rank's, so they do not inherit the
    mask, and the forkserver itself, in the rank's process group, dies of the SIGTERM; a
    worker whose parent is gone leaves its loop (torch/utils/data/_utils/worker.py,
    `ManagerWatchdog`) and the rank's next batch fails."""
    if worker_start_method(loader) == "forkserver":
        raise ValueError(
            "this DataLoader starts its workers from a forkserver (Python 3.14's default on "
            "Linux): a SIGTERM to the rank's process group kills the forkserver, and its "
            "workers stop with it, so the rank cannot finish its step and save. Build the "
            "loader with multiprocessing_context=\"fork\" (or \"spawn\"), so that the rank "
            "itself starts its workers")
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
