"""The cells the launch benchmarks time (benchmarks/launch.py, launch_gpu.py), and the ways
of running them: course_lib's launch with its ranks ready or started fresh, and
torch.multiprocessing.spawn. The ranks get these functions by value, as from a notebook."""

from __future__ import annotations

import os
import socket
import statistics
import sys
import time
from collections.abc import Callable

import cloudpickle
import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import launch, telemetry

READING_S = 1.0  # a person reads a cell's output at least this long before the next cell


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
    """A lesson's training cell: DDP around an 8-32-1 MLP, SGD, 20 steps. It sets up its own
    process group where the launcher has not (mp.spawn, accelerate), as a torchrun script
    would."""
    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo")
    start = time.perf_counter()
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = telemetry.Recorder(enabled=record)
    if record:
        rec.watch_ddp(model)
    ends = [time.perf_counter()]  # set-up done, then each step's end
    for step in range(20):
        with rec.step(step):
            x, y = torch.randn(16, 8), torch.randn(16, 1)
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            rec.scalar("loss", loss)
        ends.append(time.perf_counter())
    uss = psutil.Process().memory_full_info().uss
    if own_group:
        del model, opt
        dist.destroy_process_group()
    return {"loss": loss.item(), "uss": uss, "setup_s": ends[0] - start,
            "first_step_s": ends[1] - ends[0], "later_steps_s": ends[-1] - ends[1],
            "uss_s": time.perf_counter() - ends[-1]}


def train_cell_recorded() -> dict:
    return train_cell(record=True)


def timed_launches(fn: Callable, world_size: int, runs: int, ready: bool,
                   **options) -> list[tuple[float, list]]:
    """`runs` launches of fn, each READING_S after the last ended, as a person runs cells:
    with ready ranks (started while they read), or with fresh ranks every time. Each
    launch's seconds and its ranks' results."""
    launch(fn, world_size, echo=False, fresh=not ready, **options)  # forkserver up
    timed = []
    for _ in range(runs):
        time.sleep(READING_S)
        start = time.perf_counter()
        run = launch(fn, world_size, echo=False, fresh=not ready, **options)
        timed.append((time.perf_counter() - start, run.results))
    return timed


def launch_seconds(fn: Callable, world_size: int, runs: int, ready: bool,
                   **options) -> list[float]:
    """The seconds of timed_launches alone."""
    return [seconds for seconds, _ in timed_launches(fn, world_size, runs, ready, **options)]


def median_p90(times: list[float]) -> str:
    return f"{statistics.median(times):.3f} s ({statistics.quantiles(times, n=10)[-1]:.3f} s)"


def median_of(fn: Callable[[], float | None], runs: int) -> float | None:
    values = [fn() for _ in range(runs)]
    return None if None in values else statistics.median(v for v in values if v is not None)


def free_port() -> int:
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
    tmp.spawn(_spawn_entry, args=(world_size, free_port(), fn, queue), nprocs=world_size)
    results = [queue.get() for _ in range(world_size)]
    took = time.perf_counter() - start
    assert len(results) == world_size
    return took


cloudpickle.register_pickle_by_value(sys.modules[__name__])
