"""Launch benchmark: cold and warm launch times vs torch.multiprocessing.spawn, time from a
fault to its error, and a leak check over 200 launches.

Run:  .venv/bin/python benchmarks/launch.py          (about 2 minutes on 2 cores)
Each launch does the same work: init the process group, one all-reduce, results back.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from course_lib import DistributedError, launch

COLD_RUNS, WARM_RUNS, SPAWN_RUNS, STRESS_LAUNCHES = 5, 20, 5, 200


def one_all_reduce() -> float:
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def cold_launch_seconds(world_size: int) -> float:
    """The first launch in a fresh Python process that has already imported torch."""
    code = ("import time, torch, torch.distributed as dist, course_lib\n"
            "def f():\n    t = torch.ones(1); dist.all_reduce(t); return t.item()\n"
            "import cloudpickle, sys; cloudpickle.register_pickle_by_value(sys.modules[__name__])\n"
            f"s = time.perf_counter(); course_lib.launch(f, {world_size}, echo=False)\n"
            "print(time.perf_counter() - s)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def warm_launch_seconds(world_size: int) -> list[float]:
    launch(one_all_reduce, world_size, echo=False)
    times = []
    for _ in range(WARM_RUNS):
        start = time.perf_counter()
        run = launch(one_all_reduce, world_size, echo=False)
        times.append(time.perf_counter() - start)
        assert run.results == [float(world_size)] * world_size
    return times


def _spawn_worker(rank: int, world_size: int, port: int, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    queue.put((rank, one_all_reduce()))
    dist.destroy_process_group()


def spawn_seconds(world_size: int) -> float:
    """The same work with torch.multiprocessing.spawn (fresh interpreters each time)."""
    queue = tmp.get_context("spawn").SimpleQueue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    tmp.spawn(_spawn_worker, args=(world_size, port, queue), nprocs=world_size)
    results = [queue.get() for _ in range(world_size)]
    took = time.perf_counter() - start
    assert sorted(v for _, v in results) == [float(world_size)] * world_size
    return took


def launch_table() -> list[str]:
    rows = ["| ranks | cold launch (median of 5) | warm launch median (p90) of 20 | "
            "mp.spawn median of 5 | warm speed-up |", "|---|---|---|---|---|"]
    for n in (2, 4):
        cold = statistics.median(cold_launch_seconds(n) for _ in range(COLD_RUNS))
        warm = warm_launch_seconds(n)
        spawn = statistics.median(spawn_seconds(n) for _ in range(SPAWN_RUNS))
        med, p90 = statistics.median(warm), statistics.quantiles(warm, n=10)[-1]
        rows.append(f"| {n} | {cold:.2f} s | {med:.3f} s ({p90:.3f} s) | {spawn:.2f} s | "
                    f"{spawn / med:.0f}x |")
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


def stress_table() -> list[str]:
    launch(one_all_reduce, 2, echo=False)
    before = _resources()
    start = time.perf_counter()
    for _ in range(STRESS_LAUNCHES):
        launch(one_all_reduce, 2, echo=False)
    took = time.perf_counter() - start
    time.sleep(0.5)
    after = _resources()
    rows = [f"| after {STRESS_LAUNCHES} launches ({took:.1f} s) | before | after | leaked |",
            "|---|---|---|---|"]
    rows += [f"| {k} | {before[k]} | {after[k]} | {after[k] - before[k]} |" for k in before]
    return rows


def main() -> None:
    print(f"# launch benchmark: torch {torch.__version__}, {os.cpu_count()} cores, "
          f"Python {sys.version.split()[0]}\n")
    for table in (launch_table, fault_table, stress_table):
        print("\n".join(table()), end="\n\n", flush=True)


if __name__ == "__main__":
    main()
