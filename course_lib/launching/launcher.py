"""launch(): run a function on every rank of a fresh process group, from a notebook.

This module supervises the ranks (start, relay output, deadlines, stop); what they left
behind becomes a Run or a DistributedError in outcome.py."""

from __future__ import annotations

import os
import selectors
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

from course_lib import network
from course_lib.launching import flight, net
from course_lib.launching.forkserver import (
    Worker,
    dump_stacks,
    kill,
    reap,
    start_worker,
    wait_until_ready,
)
from course_lib.launching.headline import headline_first
from course_lib.launching.outcome import outcome
from course_lib.launching.payload import pack
from course_lib.launching.rank_main import WorkerSpec
from course_lib.launching.run import LogLine, Run
from course_lib.launching.validate import check_launch_args, check_seconds, choose_backend

# After one rank fails, the others get this long to report their own errors
# (a peer's "Connection closed" arrives within milliseconds) before they are stopped.
FAILURE_GRACE_S = 1.5
# The flight recorder for the desync report: on by default only if it costs a small DDP
# step <= 2% (benchmarks/flight_recorder.py).
DESYNC_REPORT_DEFAULT = True


# The collective timeout's ceiling, the one home of the number: launch's default is
# min(this, timeout - 1), so that a hung collective fails (and is reported) before the
# launch's own timeout stops the ranks; the x-ray uses min(this, timeout / 4) (its reason
# is in course_lib/xray/__init__.py).
PG_TIMEOUT_MAX_S = 30.0


def launch(
    fn: Callable[..., Any],
    world_size: int = 2,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    timeout: float = 60,
    backend: str = "auto",
    env: dict[str, str] | None = None,
    *,
    pg_timeout: float | None = None,
    echo: bool = True,
    desync_report: bool = DESYNC_REPORT_DEFAULT,
) -> Run:
    """Run fn(*args, **kwargs) on `world_size` ranks and return their results in a Run.

    Each rank is a fresh process whose default process group is initialised (gloo on CPU,
    or NCCL with one GPU per rank), with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT set as torchrun sets them. Output appears live, prefixed "[rank N]".
    Any failure, or `timeout` seconds passing, raises one DistributedError naming every
    failing rank. `pg_timeout` is the process group's collective timeout (default: 30 s,
    or less when `timeout` is shorter). `env` may set OMP_NUM_THREADS (default 1).
    `desync_report` reads every rank's collectives from PyTorch's flight recorder (on by
    default in torch 2.13), so that a failed launch's error shows them side by side, the
    first difference marked.
    """
    try:  # bad input: in a notebook, its message first, not the checks' frames
        args, kwargs, env = check_launch_args(fn, world_size, args, kwargs, timeout, env)
        backend = choose_backend(backend, world_size, env)
        payload = pack(fn, args, kwargs)
        if pg_timeout is None:
            pg_timeout = max(1.0, min(PG_TIMEOUT_MAX_S, timeout - 1.0))
        check_seconds("pg_timeout", pg_timeout)
    except (TypeError, ValueError) as bad:
        headline_first(bad)
        raise
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(network.free_port()), **env}
    if desync_report:
        env.setdefault("TORCH_FR_BUFFER_SIZE", flight.BUFFER_SIZE)
    with tempfile.TemporaryDirectory(prefix="course_lib-") as tmp:
        specs = [_spec(r, world_size, backend, pg_timeout, env, tmp) for r in range(world_size)]
        return _Launch(specs, payload, timeout, echo).run()


def _spec(rank: int, world_size: int, backend: str, pg_timeout: float,
          env: dict[str, str], tmp: str) -> WorkerSpec:
    torchrun_env = {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
        "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
        "OMP_NUM_THREADS": "1", **net.loopback_env(), **env,
    }
    return WorkerSpec(
        rank=rank, world_size=world_size, backend=backend, pg_timeout=pg_timeout,
        threads=int(torchrun_env["OMP_NUM_THREADS"]), env=torchrun_env,
        store_path=os.path.join(tmp, "store"), stack_path=os.path.join(tmp, f"stack{rank}"),
        flight_path=os.path.join(tmp, f"flight{rank}") if env.get("TORCH_FR_BUFFER_SIZE") else "",
        extras_path=os.path.join(tmp, f"extras{rank}"),
    )


class _Launch:
    """One launch: start the ranks, relay their output, watch for failures and hangs."""

    def __init__(self, specs: list[WorkerSpec], payload: bytes, timeout: float, echo: bool):
        self.specs, self.payload, self.timeout, self.echo = specs, payload, timeout, echo
        self.workers: list[Worker] = []
        self.logs: list[LogLine] = []
        self.timed_out = False

    def run(self) -> Run:
        wait_until_ready(self.echo)  # the first launch after import may find it still starting
        start = time.monotonic()
        alive_r, alive_w = os.pipe()  # workers exit when this kernel's end closes
        alive = Connection(alive_r, writable=False)
        try:
            try:
                for spec in self.specs:
                    self.workers.append(start_worker(spec, self.payload, alive))
            finally:
                alive.close()
            self._supervise(start + self.timeout)
        finally:
            with _sigint_deferred():
                self._stop([w for w in self.workers if w.running], "stopped", stacks=False)
                self._close_pipes()
                os.close(alive_w)
        return outcome(self.workers, self.logs, time.monotonic() - start, self.timeout,
                       self.timed_out)

    # -- the loop -------------------------------------------------------------------------

    def _supervise(self, deadline: float) -> None:
        with selectors.DefaultSelector() as sel:
            for w in self.workers:
                sel.register(w.stdout_fd, selectors.EVENT_READ, (w, "stdout"))
                sel.register(w.stderr_fd, selectors.EVENT_READ, (w, "stderr"))
                sel.register(w.messages, selectors.EVENT_READ, (w, "messages"))
                sel.register(w.process.sentinel, selectors.EVENT_READ, (w, "exit"))
            while sel.get_map():
                self._check_deadlines(deadline)
                for key, _ in sel.select(timeout=0.05):
                    worker, what = key.data
                    if not self._handle(worker, what):
                        sel.unregister(key.fileobj)

    def _check_deadlines(self, deadline: float) -> None:
        now = time.monotonic()
        running = [w for w in self.workers if w.running]
        if running and now >= deadline:
            self.timed_out = True
            self._stop(running, "timeout", stacks=True)
            return
        failed = [w.event_time for w in self.workers if _failed(w)]
        if running and failed and now >= min(failed) + FAILURE_GRACE_S:
            self._stop(running, "stopped", stacks=True)

    def _handle(self, worker: Worker, what: str) -> bool:
        """Process one ready pipe; return False once it is finished with."""
        if what == "exit":
            reap(worker, timeout=0)
            kill(worker)  # whatever it left in its process group (DataLoader workers)
            worker.event_time = worker.event_time or time.monotonic()
            return False
        if what == "messages":
            return self._receive(worker)
        data = os.read(worker.stdout_fd if what == "stdout" else worker.stderr_fd, 65536)
        self._relay(worker, what, data.decode(errors="replace") if data else None)
        return bool(data)

    def _receive(self, worker: Worker) -> bool:
        try:
            kind, body = worker.messages.recv()
        except (EOFError, OSError):
            return False
        worker.timings[kind] = time.time()
        if kind == "result":
            worker.result = body
        elif kind == "error":
            worker.error = body
            worker.event_time = time.monotonic()
        return True

    def _relay(self, worker: Worker, stream: str, text: str | None) -> None:
        """Split output into lines, echo each as "[rank N] ...", keep them in the run."""
        buffered = worker.pending[stream] + (text if text is not None else "\n")
        *lines, worker.pending[stream] = buffered.split("\n")
        if text is None and lines and lines[-1] == "":
            lines.pop()
        for line in lines:
            self.logs.append(LogLine(worker.rank, stream, time.time(), line))
            worker.output.append(line)
            if self.echo:
                out = sys.stdout if stream == "stdout" else sys.stderr
                out.write(f"[rank {worker.rank}] {line}\n")
                out.flush()

    # -- stopping ---------------------------------------------------------------------------

    def _stop(self, workers: list[Worker], reason: str, stacks: bool) -> None:
        if not workers:
            return
        if stacks:
            dump_stacks(workers)
        for w in workers:
            w.stopped = reason
            w.event_time = time.monotonic()
            kill(w)
        for w in workers:
            reap(w)

    def _close_pipes(self) -> None:
        for w in self.workers:
            for fd in (w.stdout_fd, w.stderr_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
            w.messages.close()
            if w.process.exitcode is not None:
                w.process.close()


def _failed(w: Worker) -> bool:
    """Whether a rank has failed: it sent an error, or it exited without a result."""
    return w.error is not None or (w.exitcode is not None and w.result is None)


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold a Ctrl-C that arrives during cleanup until cleanup is done, so no worker is
    left behind; then raise it. (Python handles signals in the main thread only.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda *_: caught.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt
