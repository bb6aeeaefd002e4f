"""Launch benchmark: a trivial cell and a real training cell, cold and warm, against
torch.multiprocessing.spawn (and accelerate's notebook_launcher where it is installed), the
memory it takes, the time from a fault to its error, and a leak check over 200 launches.

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
import torch.multiprocessing as tmp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import DistributedError, launch, telemetry

COLD_RUNS, WARM_RUNS, SPAWN_RUNS, STRESS_LAUNCHES = 3, 20, 3, 200


def one_all_reduce() -> float:
    """The trivial cell (it sets up its own group where the launcher has not)."""
    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    if own_group:
        dist.destroy_process_group()
    return t.item()


def train_cell(record: bool = False) -> dict:
    """A lesson's training cell. It sets up its own process group where the launcher has
    not (mp.spawn, accelerate), as a torchrun script would."""
    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo")
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = telemetry.Recorder(enabled=record)
    if record:
        rec.watch_ddp(model)
    for step in range(20):
        with rec.step(step):
            x, y = torch.randn(16, 8), torch.randn(16, 1)
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            rec.scalar("loss", loss)
    uss = psutil.Process().memory_full_info().uss
    if own_group:
        del model, opt
        dist.destroy_process_group()
    return {"loss": loss.item(), "uss": uss}


def train_cell_recorded() -> dict:
    return train_cell(record=True)


# -- other launchers, the same cell ---------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn_entry(rank: int, world_size: int, port: int, fn: Callable, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    queue.put(fn())


def spawn_seconds(fn: Callable, world_size: int) -> float:
    """fn on world_size ranks with torch.multiprocessing.spawn (fresh interpreters)."""
    queue = tmp.get_context("spawn").SimpleQueue()
    start = time.perf_counter()
    tmp.spawn(_spawn_entry, args=(world_size, _free_port(), fn, queue), nprocs=world_size)
    results = [queue.get() for _ in range(world_size)]
    took = time.perf_counter() - start
    assert len(results) == world_size
    return took


def accelerate_seconds(fn: Callable, world_size: int) -> float | None:
    """fn with accelerate's notebook_launcher (fork + elastic agent), or None without it."""
    try:
        from accelerate import notebook_launcher
    except ImportError:
        return None
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        notebook_launcher(fn, num_processes=world_size, use_port=str(_free_port()))
    return time.perf_counter() - start


def warm_seconds(fn: Callable, world_size: int, runs: int = WARM_RUNS) -> list[float]:
    launch(fn, world_size, echo=False)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        launch(fn, world_size, echo=False)
        times.append(time.perf_counter() - start)
    return times


def _median(fn: Callable[[], float | None], runs: int) -> float | None:
    values = [fn() for _ in range(runs)]
    return None if None in values else statistics.median(values)


def _s(value: float | None, digits: int = 2) -> str:
    return "not installed" if value is None else f"{value:.{digits}f} s"


def trivial_table() -> list[str]:
    rows = ["| ranks | warm launch median (p90) of 20 | mp.spawn median of 3 | speed-up |",
            "|---|---|---|---|"]
    for n in (2, 4):
        warm = warm_seconds(one_all_reduce, n)
        spawn = _median(lambda n=n: spawn_seconds(one_all_reduce, n), SPAWN_RUNS)
        med, p90 = statistics.median(warm), statistics.quantiles(warm, n=10)[-1]
        rows.append(f"| {n} | {med:.3f} s ({p90:.3f} s) | {spawn:.2f} s | {spawn / med:.0f}x |")
    return rows


def training_table() -> list[str]:
    rows = ["| ranks | course_lib warm, median (p90) of 20 | with telemetry | mp.spawn | "
            "accelerate notebook_launcher | vs spawn | vs accelerate |",
            "|---|---|---|---|---|---|---|"]
    for n in (2, 4):
        warm = warm_seconds(train_cell, n)
        recorded = statistics.median(warm_seconds(train_cell_recorded, n))
        spawn = _median(lambda n=n: spawn_seconds(train_cell, n), SPAWN_RUNS)
        acc = _median(lambda n=n: accelerate_seconds(train_cell, n), SPAWN_RUNS)
        med, p90 = statistics.median(warm), statistics.quantiles(warm, n=10)[-1]
        vs_acc = "-" if acc is None else f"{acc / med:.0f}x"
        rows.append(f"| {n} | {med:.3f} s ({p90:.3f} s) | {recorded:.3f} s | {spawn:.2f} s | "
                    f"{_s(acc)} | {spawn / med:.0f}x | {vs_acc} |")
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
    from launch_gpu import gpu_table  # here: launch_gpu imports this module

    tables = (trivial_table, training_table, gpu_table, cold_table, memory_table,
              fault_table, stress_table)
    for table in (gpu_table,) if "--gpu" in sys.argv[1:] else tables:
        print("\n".join(table()), end="\n\n", flush=True)


if __name__ == "__main__":
    main()
