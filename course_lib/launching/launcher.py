"""launch(): run a function on every rank of a fresh process group, from a notebook.

This module supervises the ranks (start, relay output, deadlines, stop); what they left
behind becomes a Run or a DistributedError in outcome.py."""

from __future__ import annotations

import os
import selectors
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from course_lib.launching import flight, ranks, standby
from course_lib.launching.forkserver import Worker, dump_stacks, kill, reap, wait_until_ready
from course_lib.launching.headline import headline_first
from course_lib.launching.outcome import outcome
from course_lib.launching.payload import pack
from course_lib.launching.ranks import RankKey, RankSet
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
    fresh: bool = False,
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
    first difference marked. Ranks started ahead for the same launch (standby.py) are used
    when they match; `fresh=True` starts new ones and leaves none ready after it (for a
    cell that times the ranks' set-up).
    """
    try:  # bad input: in a notebook, its message first, not the checks' frames
        args, kwargs, env = check_launch_args(fn, world_size, args, kwargs, timeout, env)
        backend = choose_backend(backend, world_size, env)
        payload = pack(fn, args, kwargs)
        if pg_timeout is None:
            pg_timeout = max(1.0, min(PG_TIMEOUT_MAX_S, timeout - 1.0))
        check_seconds("pg_timeout", pg_timeout)
        if not isinstance(fresh, bool):
            raise TypeError(f"fresh must be True or False, not {fresh!r}")
    except (TypeError, ValueError) as bad:
        headline_first(bad)
        raise
    if desync_report:
        env.setdefault("TORCH_FR_BUFFER_SIZE", flight.BUFFER_SIZE)
    key = RankKey.of(world_size, backend, pg_timeout, env)
    start = time.monotonic()
    ready = None if fresh else standby.take(key)
    if ready is None:
        if fresh:
            standby.discard()  # no idle ranks beside the ones this cell times
        wait_until_ready(echo)  # the first launch after import may find it still starting
        start = time.monotonic()
    try:
        return _Launch(ready or ranks.start(key), payload, timeout, echo, start).run()
    except KeyboardInterrupt:
        fresh = True  # an interrupted cell leaves no ranks behind it
        raise
    finally:
        if not fresh:
            standby.after_launch(key)


class _Launch:
    """One launch: give the ranks their function, relay their output, watch for failures
    and hangs, then build the outcome and remove the ranks' folder."""

    def __init__(self, rank_set: RankSet, payload: bytes, timeout: float, echo: bool,
                 start: float):
        self.ranks, self.payload, self.timeout, self.echo = rank_set, payload, timeout, echo
        self.start = start
        self.workers: list[Worker] = rank_set.workers
        self.logs: list[LogLine] = []
        self.timed_out = False

    def run(self) -> Run:
        try:
            try:
                self._supervise(self.start + self.timeout)
            finally:
                with _sigint_deferred():
                    leaving = [w for w in self.workers if w.running and w.exiting]
                    self._stop([w for w in self.workers if w.running and not w.exiting],
                               "stopped", stacks=False)
                    ranks.retire(leaving)
                    ranks.close_pipes(self.ranks)
            return outcome(self.workers, self.logs, time.monotonic() - self.start,
                           self.timeout, self.timed_out)
        finally:
            self.ranks.folder.cleanup()

    # -- the loop -------------------------------------------------------------------------

    def _supervise(self, deadline: float) -> None:
        with selectors.DefaultSelector() as sel:
            for w in self.workers:
                sel.register(w.stdout_fd, selectors.EVENT_READ, (w, "stdout"))
                sel.register(w.stderr_fd, selectors.EVENT_READ, (w, "stderr"))
                sel.register(w.messages, selectors.EVENT_READ, (w, "messages"))
                sel.register(w.process.sentinel, selectors.EVENT_READ, (w, "exit"))
            while sel.get_map() and not self._all_returned():
                self._check_deadlines(deadline)
                for key, _ in sel.select(timeout=0.05):
                    worker, what = key.data
                    if not self._handle(worker, what):
                        sel.unregister(key.fileobj)
            self._drain_output(sel)

    def _all_returned(self) -> bool:
        """Whether every rank returned and said all it will say: the cell is done, without
        waiting for the processes' exits (they are collected later, ranks.retire)."""
        return all(w.exiting and w.result is not None for w in self.workers)

    def _drain_output(self, sel: selectors.BaseSelector) -> None:
        """Relay what is left in the output pipes of ranks that are exiting (written before
        they said so), and a last line without its newline."""
        for key in list(sel.get_map().values()):
            worker, what = key.data
            if what not in ("stdout", "stderr"):
                continue
            os.set_blocking(key.fd, False)
            try:
                while self._handle(worker, what):  # False at the pipe's end, last line relayed
                    pass
            except BlockingIOError:  # nothing more to read, the pipe still open: the last line
                self._relay(worker, what, None)

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
        if kind == "exiting":
            worker.exiting = True
            return True
        worker.timings[kind] = body if kind in ("started", "ready") else time.time()
        if kind == "ready":
            self._send_function(worker)
        elif kind == "result":
            worker.result = body
        elif kind == "error":
            worker.error = body
            worker.event_time = time.monotonic()
        return True

    def _send_function(self, worker: Worker) -> None:
        """A rank that set up waits for its function: send it (a rank that died meanwhile
        shows its exit)."""
        try:
            worker.payload.send_bytes(self.payload)
        except OSError:
            pass

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
