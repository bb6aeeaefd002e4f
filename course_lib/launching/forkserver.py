"""Start worker processes from a forkserver with torch preloaded, and stop them for sure.

Never plain fork from the kernel: a child of a process that already ran a parallel op can
hang forever (docs/facts.md). The forkserver is a clean process that imported torch and
what a training step imports lazily, and ran no tensor op, so forking from it is safe and
a rank pays no import time. It starts in the background when the notebook imports
`launch` (see warm_up), so a learner who reads a cell first does not wait for it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing import context, popen_forkserver, spawn
from multiprocessing.connection import Connection
from typing import Any

from course_lib.launching.rank_main import ErrorReport, WorkerSpec, run_worker
from course_lib.launching.rank_record import STOP_SIGNAL

# What the forkserver imports once, so that no rank imports it again. The rank's own code,
# then what a first training step would import lazily: DDP's constructor and every optimizer
# import torch._dynamo (1.1-1.7 s of CPU per rank, measured in a rank on the 2-core machine);
# the profiler, DataLoader and the course's recorder are the lessons' other tools.
# ZeroRedundancyOptimizer and DCP (lessons 11, 13, 14) cost 2.3-2.8 s per 2-rank launch
# when imported in the ranks (load average 7); fully_shard needs nothing more.
PRELOAD = [
    "course_lib.launching.rank_main",
    "torch._dynamo",
    "torch.nn.parallel",
    "torch.optim",
    "torch.profiler",
    "torch.utils.data",
    "course_lib.telemetry",
    "torch.distributed.optim",
    "torch.distributed.checkpoint",
    "course_lib.launching.forkserver_exit",  # last: see its docstring
]
WAIT_QUIETLY_S = 1.0  # the first launch says why it waits only when it waits longer

_context: Any = None
_ready = threading.Event()
_warming: threading.Thread | None = None


def forkserver_context() -> Any:
    """The multiprocessing context whose forkserver preloads PRELOAD (started on first use)."""
    global _context
    if _context is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _context = ctx
    return _context


def warm_up() -> None:
    """Start the forkserver now, in a background thread, and mark it ready once it has
    forked a first (empty) process, which it can do only after its imports. Not in a
    multiprocessing child (nor while one imports its parent's main module as __mp_main__)
    nor a rank (RANK set, as by torchrun), where no launch follows."""
    importing_as_child = sys.modules.get("__mp_main__") is not sys.modules.get("__main__")
    in_child = mp.parent_process() is not None or importing_as_child
    if not in_child and "RANK" not in os.environ:
        _start_warming()


def _start_warming() -> None:
    global _warming
    if _warming is None:
        _warming = threading.Thread(target=_fork_one, name="course_lib-warm-up", daemon=True)
        _warming.start()


def wait_until_ready(echo: bool) -> None:
    """Block until the forkserver is ready; say so once if that takes a while."""
    _start_warming()
    if not _ready.wait(WAIT_QUIETLY_S):
        if echo:
            print("starting workers (first launch only)...", file=sys.stdout, flush=True)
        _ready.wait()


def _fork_one() -> None:
    try:
        forkserver_context()
        process = _Process(target=_nothing, name="course_lib-warm-up")
        process.start()
        process.join()
        process.close()
    except Exception:  # noqa: BLE001 - a broken forkserver shows its error at the launch
        pass
    finally:
        _ready.set()


def _nothing() -> None:
    """The warm-up process's work."""


class _Popen(popen_forkserver.Popen):
    """Start a forkserver child without re-importing the kernel's __main__.

    multiprocessing re-runs the parent's main module in each child (a script, or
    ipykernel_launcher in Jupyter). Our workers need nothing from it: the function
    travels by value. Skipping it saves time and never re-runs a learner's script.
    """

    def _launch(self, process_obj: Any) -> None:
        _without_main.on = True  # for this thread only: the warm-up runs beside the kernel
        try:
            super()._launch(process_obj)  # type: ignore[misc]  # not in typeshed's Popen
        finally:
            _without_main.on = False


_without_main = threading.local()
_preparation_data = spawn.get_preparation_data


def _preparation_data_for_thread(name: str) -> dict[str, Any]:
    """multiprocessing's preparation data, less the main module for our own starts."""
    data = _preparation_data(name)
    if getattr(_without_main, "on", False):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


spawn.get_preparation_data = _preparation_data_for_thread  # other callers: unchanged


class _Process(context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:
        return _Popen(process_obj)


@dataclass
class Worker:
    """The kernel's handle on one rank: its process, pipes and what it reported."""

    spec: WorkerSpec
    process: Any
    messages: Connection
    stdout_fd: int
    stderr_fd: int
    payload: Connection  # the function goes here once the rank says it is ready
    pending: dict[str, str] = field(default_factory=lambda: {"stdout": "", "stderr": ""})
    output: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    result: tuple[bytes, bytes] | None = None  # (return value, extras), pickled apart
    error: ErrorReport | None = None
    exitcode: int | None = None
    stopped: str = ""  # "timeout" or "stopped" when the launcher ended it
    exiting: bool = False  # it said all it will say and is in os._exit (rank_main)
    stack: str = ""
    event_time: float = 0.0  # monotonic time of its failure (error message or exit)

    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def running(self) -> bool:
        return self.exitcode is None


def start_worker(spec: WorkerSpec, alive_r: Connection) -> Worker:
    """Start one rank, which sets up its process group and then waits for its function on
    the payload pipe; the kernel keeps only its ends of the pipes."""
    ctx = forkserver_context()
    msg_r, msg_w = ctx.Pipe(duplex=False)
    pay_r, pay_w = ctx.Pipe(duplex=False)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    out_conn, err_conn = Connection(out_w, readable=False), Connection(err_w, readable=False)
    process = _Process(
        target=run_worker,
        args=(spec, msg_w, pay_r, out_conn, err_conn, alive_r),
        name=f"course_lib-rank{spec.rank}",
    )
    try:
        process.start()
    finally:
        for conn in (msg_w, pay_r, out_conn, err_conn):
            conn.close()
    return Worker(spec, process, msg_r, out_r, err_r, pay_w)


def kill(worker: Worker) -> None:
    """SIGKILL the rank and everything in its process group (DataLoader workers too)."""
    pid = worker.process.pid
    if pid is None:
        return
    for send in (os.killpg, os.kill):  # the group exists once the worker ran setpgrp()
        try:
            send(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def reap(worker: Worker, timeout: float = 3.0) -> None:
    """Wait for a killed worker and record its exit code."""
    worker.process.join(timeout)
    worker.exitcode = worker.process.exitcode


def dump_stacks(workers: list[Worker], wait: float = 1.0) -> None:
    """Ask running ranks for their Python stacks (faulthandler on SIGUSR1) and their last
    words and flight recorders (STOP_SIGNAL, rank_record.py), and keep the stacks."""
    sizes, stamps = {}, {}
    for w in workers:
        sizes[w.rank] = _size(w.spec.stack_path)
        stamps[w.rank] = _stamps(w.spec)
        for sig in (signal.SIGUSR1, STOP_SIGNAL):
            try:
                os.kill(w.process.pid, sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if all(_size(w.spec.stack_path) > sizes[w.rank] and _all_new(_stamps(w.spec),
                                                                     stamps[w.rank])
               for w in workers):
            time.sleep(0.05)  # let the last thread's lines land
            break
    for w in workers:
        try:
            with open(w.spec.stack_path, errors="replace") as f:
                f.seek(sizes[w.rank])
                w.stack = f.read()
        except FileNotFoundError:  # stopped before its Python code began
            w.stack = "(no stack: the rank was still starting up)"


def _stamps(spec: WorkerSpec) -> list[tuple[int, int] | None]:
    """The stamps of the files a stopped rank rewrites: last words, and the flight dump."""
    return [_stamp(p) for p in (spec.extras_path, spec.flight_path) if p]


def _all_new(now: list[tuple[int, int] | None], before: list[tuple[int, int] | None]) -> bool:
    return all(a != b for a, b in zip(now, before))


def _stamp(path: str) -> tuple[int, int] | None:
    """A file's identity and change time (a new dump replaces the file), None if absent."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
