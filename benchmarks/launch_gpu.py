"""GPU rows of the launch benchmark (benchmarks/launch.py runs them; --gpu runs them alone).

A warm 1-rank NCCL training cell on ready ranks (started while the person reads, so their
CUDA context and NCCL group are made before the cell), and on fresh ranks, split into the
fork and the rank's set-up, the CUDA context and the NCCL group (from the rank's "started"
and "ready" stamps; the context is timed apart in a warm gloo rank), and the cell's own
work; beside the same cell under torch.multiprocessing.spawn and the CPU training cell on
gloo. Skipped without a GPU.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import cloudpickle
import torch
import torch.distributed as dist
import torch.nn as nn
from cells import launch_seconds, median_of, spawn_seconds, train_cell
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import launch

GPU_RUNS = 5


def gpu_train_cell() -> float:
    """The GPU form of the training cell (a bigger MLP: 512-2048-10, batch 64, 20 DDP steps).
    Under mp.spawn it sets up its own NCCL group, bound to cuda:0, as a torchrun script would."""
    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    device = torch.device("cuda", torch.cuda.current_device())
    model = DDP(nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10)).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        loss = model(torch.randn(64, 512, device=device)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize(device)
    if own_group:
        del model, opt
        dist.destroy_process_group()
    return loss.item()


def cuda_context_seconds() -> float:
    """In a warm rank whose launcher did not touch CUDA (gloo): time to create the context."""
    start = time.perf_counter()
    torch.cuda.init()
    torch.ones(1, device="cuda").add_(1)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _phases(fn: Callable, backend: str) -> dict[str, float]:
    """One warm 1-rank launch on fresh ranks: the wall time and its parts from the rank's
    stamps."""
    start_wall, start = time.time(), time.perf_counter()
    run = launch(fn, 1, backend=backend, echo=False, fresh=True)
    took = time.perf_counter() - start
    t = run.timings[0]
    return {"wall": took, "fork": t["started"] - start_wall,
            "group": t["ready"] - t["started"], "cell": t["result"] - t["ready"]}


def gpu_table() -> list[str]:
    """Where a warm 1-rank NCCL training cell's time goes, beside mp.spawn and gloo."""
    if not torch.cuda.is_available():
        return ["GPU rows: skipped: torch.cuda.is_available() is False on this machine."]
    launch(gpu_train_cell, 1, backend="nccl", echo=False)  # warm: forkserver up
    nccl = [_phases(gpu_train_cell, "nccl") for _ in range(GPU_RUNS)]
    context = statistics.median(launch(cuda_context_seconds, 1, backend="gloo", echo=False)
                                .results[0] for _ in range(GPU_RUNS))
    gloo = statistics.median(_phases(train_cell, "gloo")["wall"] for _ in range(GPU_RUNS))
    spawn = median_of(lambda: spawn_seconds(gpu_train_cell, 1), 2)
    ready = statistics.median(launch_seconds(gpu_train_cell, 1, GPU_RUNS, ready=True,
                                             backend="nccl"))

    def med(key: str) -> float:
        return statistics.median(p[key] for p in nccl)

    group = med("group")
    return [
        f"GPU: {torch.cuda.get_device_name(0)}; medians of {GPU_RUNS} warm launches "
        "(mp.spawn: of 2)",
        "", "| 1-rank cell | time |", "|---|---|",
        f"| NCCL training cell on ready ranks (a second after the last cell) | {ready:.3f} s |",
        f"| NCCL training cell on fresh ranks, wall | {med('wall'):.3f} s |",
        f"| - fork and rank set-up (launch to 'started') | {med('fork'):.3f} s |",
        f"| - 'started' to 'ready': CUDA context + NCCL group + barrier | {group:.3f} s |",
        f"| -- of which CUDA context (measured apart, in a warm gloo rank) | {context:.3f} s |",
        f"| -- of which NCCL set-up and barrier (the rest) | {max(group - context, 0):.3f} s |",
        f"| - the cell's own work ('ready' to its result) | {med('cell'):.3f} s |",
        f"| gloo training cell (8-32-1 MLP, CPU), warm launch | {gloo:.3f} s |",
        f"| mp.spawn, the same NCCL training cell | {spawn:.2f} s |",
    ]


# The ranks get these functions by value, as from a notebook cell: no import of this file.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
