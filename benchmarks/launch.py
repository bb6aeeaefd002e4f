"""Launch benchmark: a trivial cell and a real training cell, each launched as a person runs
cells (a second after the last one ended) on ranks started ahead ("ready", launching/
standby.py) and on ranks started by the launch ("fresh"), against torch.multiprocessing.spawn
(and accelerate's notebook_launcher where it is installed); the first launch in a new
process, the memory it takes, the time from a fault to its error, and a leak check over 200
launches on ready ranks.

Run:  .venv/bin/python benchmarks/launch.py          (about 5 minutes on 2 cores)
      .venv/bin/python benchmarks/launch.py --gpu    (the GPU rows alone; skipped without one)
The trivial cell: init the process group, one all-reduce, results back. The training cell:
DDP around an 8-32-1 MLP, SGD, 20 steps (optionally with the course's telemetry recorder).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
from cells import (
    free_port,
    launch_seconds,
    median_of,
    median_p90,
    one_all_reduce,
    spawn_seconds,
    timed_launches,
    train_cell,
    train_cell_recorded,
)
from launch_gpu import gpu_table

from course_lib import DistributedError, launch
from course_lib.launching import standby

COLD_RUNS, WARM_RUNS, SPAWN_RUNS, STRESS_LAUNCHES = 3, 20, 3, 200


def accelerate_seconds(fn: Callable, world_size: int) -> float | None:
    """fn with accelerate's notebook_launcher (fork + elastic agent), or None without it."""
    try:
        from accelerate import notebook_launcher
    except ImportError:
        return None
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        notebook_launcher(fn, num_processes=world_size, use_port=str(free_port()))
    return time.perf_counter() - start


def _s(value: float | None, digits: int = 2) -> str:
    return "not installed" if value is None else f"{value:.{digits}f} s"


def trivial_table() -> list[str]:
    rows = ["| ranks | ready ranks, median (p90) of 20 | fresh ranks | mp.spawn, median of 3 | "
            "ready vs spawn |", "|---|---|---|---|---|"]
    for n in (2, 4):
        ready = launch_seconds(one_all_reduce, n, WARM_RUNS, ready=True)
        fresh = launch_seconds(one_all_reduce, n, WARM_RUNS, ready=False)
        spawn = median_of(lambda n=n: spawn_seconds(one_all_reduce, n), SPAWN_RUNS)
        rows.append(f"| {n} | {median_p90(ready)} | {median_p90(fresh)} | {spawn:.2f} s | "
                    f"{spawn / statistics.median(ready):.0f}x |")
    return rows


def training_table() -> list[str]:
    rows = ["| ranks | ready ranks, median (p90) of 20 | with telemetry | fresh ranks | "
            "mp.spawn | accelerate notebook_launcher | ready vs spawn |",
            "|---|---|---|---|---|---|---|"]
    for n in (2, 4):
        ready = launch_seconds(train_cell, n, WARM_RUNS, ready=True)
        recorded = statistics.median(launch_seconds(train_cell_recorded, n, WARM_RUNS,
                                                    ready=True))
        fresh = launch_seconds(train_cell, n, WARM_RUNS, ready=False)
        spawn = median_of(lambda n=n: spawn_seconds(train_cell, n), SPAWN_RUNS)
        acc = median_of(lambda n=n: accelerate_seconds(train_cell, n), SPAWN_RUNS)
        rows.append(f"| {n} | {median_p90(ready)} | {recorded:.3f} s | {median_p90(fresh)} | "
                    f"{spawn:.2f} s | {_s(acc)} | {spawn / statistics.median(ready):.0f}x |")
    return rows


def parts_table() -> list[str]:
    """Where a ready training cell's time goes: rank 0's own parts, and the rest (sending
    the function, waiting for the slowest rank, results back)."""
    rows = ["| ranks | ready training cell, median of 20 | DDP + optimizer set-up | first step "
            "| 19 later steps | reading its memory (USS) | the rest: the launcher, the slowest "
            "rank |",
            "|---|---|---|---|---|---|---|"]
    keys = ("setup_s", "first_step_s", "later_steps_s", "uss_s")
    for n in (2, 4):
        timed = timed_launches(train_cell, n, WARM_RUNS, ready=True)
        wall = statistics.median(seconds for seconds, _ in timed)
        medians = [statistics.median(results[0][k] for _, results in timed) for k in keys]
        cells = " | ".join(f"{m:.3f} s" for m in medians)
        rows.append(f"| {n} | {wall:.3f} s | {cells} | {wall - sum(medians):.3f} s |")
    return rows


COLD_CODE = """
import sys, time
start = time.perf_counter()
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch_s = time.perf_counter() - start
start = time.perf_counter()
from course_lib import launch
import_s = time.perf_counter() - start
time.sleep({delay})
def cell():
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        opt.zero_grad(); model(torch.randn(16, 8)).sum().backward(); opt.step()
import cloudpickle; cloudpickle.register_pickle_by_value(sys.modules[__name__])
start = time.perf_counter(); launch(cell, 2, echo=False)
print(import_s, time.perf_counter() - start)
"""


def cold_seconds(delay: float) -> tuple[float, float]:
    """(import course_lib's launch, first training launch) in a fresh Python process."""
    out = subprocess.run([sys.executable, "-c", COLD_CODE.format(delay=delay)],
                         capture_output=True, text=True, check=True)
    import_s, first_s = out.stdout.split()[-2:]
    return float(import_s), float(first_s)


def cold_table() -> list[str]:
    rows = ["| first training launch (2 ranks), fresh process | import of `launch` | "
            "first launch, median of 3 |", "|---|---|---|"]
    for delay, when in ((0, "right after `from course_lib import launch`"),
                        (5, "5 s after it")):
        runs = [cold_seconds(delay) for _ in range(COLD_RUNS)]
        rows.append(f"| {when} | {statistics.median(r[0] for r in runs):.3f} s | "
                    f"{statistics.median(r[1] for r in runs):.2f} s |")
    return rows


def memory_table() -> list[str]:
    """The forkserver's resident memory and each training rank's own pages (USS): pages
    shared copy-on-write with the forkserver are not counted, as they cost nothing more."""
    from multiprocessing import forkserver

    launch(train_cell, 2, echo=False)
    server = psutil.Process(forkserver._forkserver._forkserver_pid)
    rows = ["| process | memory |", "|---|---|",
            f"| forkserver (RSS, torch and the preloaded modules) | "
            f"{server.memory_info().rss / 2**20:.0f} MiB |"]
    for n in (2, 4):
        uss = [r["uss"] / 2**20 for r in launch(train_cell, n, echo=False).results]
        rows.append(f"| training rank, {n} ranks (USS, max of ranks) | {max(uss):.0f} MiB |")
    return rows


# -- faults -----------------------------------------------------------------------------------

def _fault(kind: str) -> None:
    if dist.get_rank() == 1:
        if kind == "exception":
            raise ValueError("boom")
        if kind == "SIGKILL":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "abort":
            os.abort()
        if kind == "hang":
            time.sleep(600)
    one_all_reduce()


def fault_table(timeout: float = 3.0) -> list[str]:
    rows = [f"| fault on rank 1 (timeout {timeout:g} s) | error after | root cause named first |",
            "|---|---|---|"]
    for kind in ("exception", "SIGKILL", "abort", "hang", "unpicklable"):
        fn, args = (_fault, (kind,)) if kind != "unpicklable" else (lambda lock: None,
                                                                   (socket.socket(),))
        start = time.perf_counter()
        try:
            launch(fn, 2, args=args, timeout=timeout, echo=False)
            named = "no error!"
        except DistributedError as err:
            named = f"rank {err.failures[0].rank}: {err.failures[0].summary[:60]}"
        except TypeError as err:
            named = f"before start: {str(err)[:60]}"
        rows.append(f"| {kind} | {time.perf_counter() - start:.2f} s | {named} |")
    return rows


# -- leaks ------------------------------------------------------------------------------------

def _resources() -> dict[str, int]:
    me = psutil.Process()
    family = [me, *me.children(recursive=True)]
    listening = 0
    for proc in family:
        try:
            listening += sum(c.status == psutil.CONN_LISTEN for c in proc.net_connections("inet"))
        except psutil.NoSuchProcess:
            pass
    shm = len(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else 0
    temp = len(list(Path(tempfile.gettempdir()).glob("course_lib-*")))
    return {"processes": len(family), "open fds": me.num_fds(), "listening ports": listening,
            "shared-memory files": shm, "temp folders": temp}


def _ready_set(wait_s: float = 5.0) -> object | None:
    """The ranks the last launch left ready, once their start has run (IDLE_S = 0 starts
    them on a timer thread: a launch straight after would cancel it first)."""
    deadline = time.perf_counter() + wait_s
    while standby._ready is None and time.perf_counter() < deadline:
        time.sleep(0.002)
    return standby._ready


def stress_table() -> list[str]:
    """200 launches, each on the ranks the previous one left ready (standby.IDLE_S = 0), then
    the ready set dropped: nothing may be left that was not there before."""
    standby.discard()
    launch(one_all_reduce, 2, echo=False, fresh=True)
    standby.discard()  # collects that launch's ranks (a launch returns before they exit)
    before = _resources()
    idle, standby.IDLE_S = standby.IDLE_S, 0.0
    used = 0
    start = time.perf_counter()
    for _ in range(STRESS_LAUNCHES):
        waiting = _ready_set()
        launch(one_all_reduce, 2, echo=False)
        used += waiting is not None and standby._ready is not waiting
    took = time.perf_counter() - start
    standby.IDLE_S = idle
    standby.discard()
    time.sleep(0.5)
    after = _resources()
    rows = [f"| after {STRESS_LAUNCHES} launches ({took:.1f} s; {used} on ready ranks) | "
            "before | after | leaked |", "|---|---|---|---|"]
    rows += [f"| {k} | {before[k]} | {after[k]} | {after[k] - before[k]} |" for k in before]
    return rows


def main() -> None:
    os.environ["COURSE_READY_RANKS"] = "1"  # as in a notebook (the default outside IPython: off)
    print(f"# launch benchmark: torch {torch.__version__}, {os.cpu_count()} cores, "
          f"Python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f}\n")
    tables = (trivial_table, training_table, parts_table, gpu_table, cold_table, memory_table,
              fault_table, stress_table)
    for table in (gpu_table,) if "--gpu" in sys.argv[1:] else tables:
        print("\n".join(table()), end="\n\n", flush=True)


if __name__ == "__main__":
    main()
