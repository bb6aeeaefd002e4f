"""What runs inside one rank: set up like torchrun, run the learner's function, report back.

The forkserver imports this module (and so torch) once; every worker is forked from it,
so a launch pays no import cost. Nothing here is called from the notebook's kernel.
"""

from __future__ import annotations

import faulthandler
import functools
import gc
import io
import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any, TypedDict

import cloudpickle
import torch
import torch.distributed as dist

from course_lib import devices
from course_lib.launching import flight, own_init, rank_record
from course_lib.launching.payload import dumps

LAUNCH_DIR = os.path.dirname(os.path.abspath(__file__))

@dataclass(frozen=True)
class WorkerSpec:
    """Everything one rank needs to know before it starts."""

    rank: int
    world_size: int
    backend: str
    pg_timeout: float
    threads: int
    env: dict[str, str]
    store_path: str
    stack_path: str
    flight_path: str = ""  # where the flight recorder is dumped; "" when it is off
    extras_path: str = ""  # its collectors' last words, and its journal beside (rank_record)


class ErrorReport(TypedDict, total=False):
    """What a rank that raised sends home: the exception's type name and message, its
    pickled TracebackException (or, when that fails, the traceback as text) and extras."""

    type: str
    message: str
    traceback: bytes | None
    text: str
    extras: bytes


def run_worker(
    spec: WorkerSpec,
    messages: Connection,
    payload_r: Connection,
    stdout_w: Connection,
    stderr_w: Connection,
    alive_r: Connection,
) -> None:
    """Entry point of a worker process; never returns (ends with os._exit). It sets up as
    torchrun's workers do, says "ready", then waits for its function on `payload_r`: a
    launch sends it at once, or later when these ranks were started ahead (standby.py)."""
    gc.freeze()  # torch's objects from the forkserver: gc.collect() skips them (0.1 s -> ms)
    os.setpgrp()  # own process group: the kernel kills us with our DataLoader children
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel handles interrupts
    _redirect_output(stdout_w, stderr_w)
    dump = functools.partial(flight.dump, spec.flight_path) if spec.flight_path else None
    rank_record.start(spec.extras_path, then=dump)  # before any thread starts (see start)
    _exit_when_kernel_dies(alive_r, os.path.dirname(spec.store_path))
    stack_file = open(spec.stack_path, "w")  # noqa: SIM115 - must outlive this frame
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    os.environ.clear()  # the kernel's environment as it is now, plus torchrun's variables
    os.environ.update(spec.env)
    dist.set_debug_level_from_env()  # torch read TORCH_DISTRIBUTED_DEBUG at import time
    torch.set_num_threads(spec.threads)
    # A forkserver child inherits "forkserver" as its start method, so every DataLoader
    # with workers would start a forkserver of its own and import torch again (seconds per
    # epoch). Back to the platform's default, as in a process that torchrun starts.
    multiprocessing.set_start_method(None, force=True)
    messages.send(("started", time.time()))
    code = _run(spec, payload_r, messages)
    if spec.flight_path:  # returned or raised: what it issued, for the desync report
        flight.dump(spec.flight_path)
    sys.stdout.flush()
    sys.stderr.flush()
    # All it had to say is in the pipes: the kernel need not wait for this process's
    # teardown (ranks.retire says why).
    try:
        messages.send(("exiting", None))
    except OSError:  # the kernel stopped listening: it is stopping this rank anyway
        pass
    # No destroy_process_group(): os._exit runs no C++ destructor, so the gloo abort at exit
    # (a DDP object outliving its group, docs/facts.md) cannot happen, and the rank skips
    # gloo's teardown (35 ms of a 0.1 s launch, measured). Peers see its sockets close, as
    # they would after a destroy: only a peer still waiting for it notices, and fails.
    os._exit(code)


def _run(spec: WorkerSpec, payload_r: Connection, messages: Connection) -> int:
    """Set up the group, wait for the function, run it; send ("result", bytes) or ("error",
    dict). Return the exit code."""
    try:
        _warm_up(_init_process_group(spec))
        messages.send(("ready", time.time()))
        try:
            payload = payload_r.recv_bytes()
        except EOFError:  # the kernel dropped these ready ranks: nothing ran, nothing to say
            os._exit(0)
        _fresh_random_state()  # as at a process's start, whenever the function comes
        fn, args, kwargs = cloudpickle.loads(payload)
        value = fn(*args, **kwargs)
    except SystemExit as exc:
        if exc.code in (None, 0):
            value = None
        else:
            _send_error(messages, exc)
            return exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, never lost
        _send_error(messages, exc)
        return 1
    return _send_result(messages, value)


def _send_result(messages: Connection, value: Any) -> int:
    """Send the return value and the collectors' data, pickled apart so that a failure in
    one is never reported as the other."""
    extras = rank_record.snapshot()
    try:
        data = dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the same message
        err = TypeError(
            f"the function returned a {type(value).__name__} that cannot be sent back to "
            f"the notebook ({exc}). Return plain data instead: numbers, lists, dicts, "
            "tensors (detached, on the CPU) or a model's state_dict()."
        )
        _send_error(messages, err.with_traceback(None), extras)
        return 1
    messages.send(("result", (data, extras)))
    return 0


def _send_error(messages: Connection, exc: BaseException, extras: bytes | None = None) -> None:
    """Describe the exception for the kernel; the traceback is formatted there, with source."""
    tbe = traceback.TracebackException.from_exception(exc, lookup_lines=False)
    tbe.stack = traceback.StackSummary.from_list(
        [f for f in tbe.stack if not f.filename.startswith(LAUNCH_DIR)]
    )
    info: ErrorReport = {"type": type(exc).__name__, "message": str(exc), "traceback": None}
    try:
        info["traceback"] = dumps(tbe)
    except Exception:  # noqa: BLE001 - an odd exception class: fall back to text
        info["text"] = "".join(tbe.format())
    info["extras"] = extras if extras is not None else rank_record.snapshot()
    messages.send(("error", info))
    del tbe
    traceback.clear_frames(exc.__traceback__)  # frames may hold DDP objects


def _init_process_group(spec: WorkerSpec) -> torch.device | None:
    """The launch's process group on a FileStore, bound to the rank's GPU under NCCL (which
    it returns; None on gloo)."""
    device = devices.bind(spec.backend, spec.rank)  # the GPU first, then the group bound to it
    store = dist.FileStore(spec.store_path, spec.world_size)
    own_init.install(store, spec.rank, spec.world_size, spec.pg_timeout)
    own_init.real_init_process_group(
        spec.backend,
        store=store,
        rank=spec.rank,
        world_size=spec.world_size,
        timeout=timedelta(seconds=spec.pg_timeout),
        device_id=device,
    )
    # gloo can let a fast rank out of its connection handshake before a slow peer has
    # finished it; were the fast rank to finish and exit, the peer's init would fail with
    # "Connection closed by peer". No rank starts the function before every rank connected.
    dist.barrier()
    return device


def _warm_up(device: torch.device | None) -> None:
    """On a GPU, one small layer forward and backward before the function comes, so that
    cuBLAS's handle and the first kernels are loaded while the ranks wait (not run on a
    GPU yet). Nothing on the CPU: no collective either, so the desync report sees only
    the learner's."""
    if device is None or device.type != "cuda":
        return
    layer = torch.nn.Linear(8, 8, device=device)
    layer(torch.ones(4, 8, device=device)).sum().backward()
    torch.cuda.synchronize(device)


def _fresh_random_state() -> None:
    """Seed torch (and NumPy's global generator) from the OS, as in a fresh process.

    A fork inherits the forkserver's generators, so without this every rank would draw
    the same "random" numbers, unlike under torchrun. (Python's random reseeds at fork.)
    """
    torch.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _redirect_output(stdout_w: Connection, stderr_w: Connection) -> None:
    """Point fds 1 and 2 (Python and C++ output alike) at the kernel's pipes."""
    os.dup2(stdout_w.fileno(), 1)
    os.dup2(stderr_w.fileno(), 2)
    stdout_w.close()
    stderr_w.close()
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):  # always, in a rank; for the type checker
            stream.reconfigure(line_buffering=True)


def _exit_when_kernel_dies(alive_r: Connection, launch_dir: str) -> None:
    """Kill this rank and its children when the kernel's end of the pipe closes, removing
    the launch's temporary folder, which a dead kernel cannot remove."""

    def watch() -> None:
        try:
            alive_r.recv_bytes()
        except (EOFError, OSError):
            pass
        shutil.rmtree(launch_dir, ignore_errors=True)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="course_lib-kernel-watch", daemon=True).start()
