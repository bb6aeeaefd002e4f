"""What PyTorch's flight recorder costs a small DDP step, to decide whether launch() keeps
it on by default (the desync report needs it; the rule: on only if it costs <= 2%).

Run:  .venv/bin/python benchmarks/flight_recorder.py      (about a minute on 2 cores)
Each launch trains an 8-32-1 MLP under DDP on 2 gloo ranks and times 200 steps after 20
warm-up steps; launches with the recorder on and off alternate, so the machine's load
falls on both alike. The figure is the median step time of each setting. Wall time on a
shared machine is noisy, so a second table measures what the recorder adds to one
collective (3000 one-number all-reduces, the main thread's CPU time, where it records).
A third table times launch.py's trivial and training cells with the report on and off,
alternating: what the report costs a launch that does not fail (each rank dumps its
recorder to a file when it returns).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from launch import one_all_reduce, train_cell  # benchmarks/launch.py, beside this file
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import launch

WARM_UP, STEPS, PAIRS = 20, 200, 16
CALLS, CALL_PAIRS = 3000, 6
LAUNCH_PAIRS = 20


def step_seconds() -> tuple[float, float]:
    """Median seconds per DDP training step on this rank: wall time, and the main
    thread's CPU time (where the recorder does its work; less disturbed by the load)."""
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    wall, cpu = [], []
    for step in range(WARM_UP + STEPS):
        start, start_cpu = time.perf_counter(), time.thread_time()
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        if step >= WARM_UP:
            wall.append(time.perf_counter() - start)
            cpu.append(time.thread_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def measure(recorder: bool) -> tuple[float, float]:
    """One launch's step times (the slower rank's medians), recorder on or off."""
    run = launch(step_seconds, 2, echo=False, desync_report=recorder)
    return max(w for w, _ in run.results), max(c for _, c in run.results)


def per_collective_seconds() -> float:
    """Main-thread CPU seconds per one-number all-reduce on this rank."""
    t = torch.ones(1)
    for _ in range(200):
        dist.all_reduce(t)
    start = time.thread_time()
    for _ in range(CALLS):
        dist.all_reduce(t)
    return (time.thread_time() - start) / CALLS


def per_collective_table(step_ms: float) -> list[str]:
    """What the recorder adds to one collective, and that as a share of a DDP step
    (the small DDP step makes one all-reduce)."""
    diffs = []
    for _ in range(CALL_PAIRS):
        off = max(launch(per_collective_seconds, 2, echo=False, desync_report=False).results)
        on = max(launch(per_collective_seconds, 2, echo=False, desync_report=True).results)
        diffs.append((on - off) * 1e6)
    med = statistics.median(diffs)
    return ["| recorder's cost per collective (CPU) | pairs | as a share of the DDP step |",
            "|---|---|---|",
            f"| {med:+.1f} us (range {min(diffs):+.1f} .. {max(diffs):+.1f}) | {CALL_PAIRS} | "
            f"{100 * med / (step_ms * 1e3):+.2f}% of {step_ms:.3f} ms |"]


def launch_cost_table() -> list[str]:
    """Warm launch time of the trivial and training cells, report off and on, alternating."""
    rows = ["| cell | ranks | report off: median launch | report on | on/off, median of pairs |",
            "|---|---|---|---|---|"]
    for name, fn in (("trivial", one_all_reduce), ("training", train_cell)):
        for n in (2, 4):
            launch(fn, n, echo=False)
            pairs = [(_launch_seconds(fn, n, False), _launch_seconds(fn, n, True))
                     for _ in range(LAUNCH_PAIRS)]
            off, on = zip(*pairs)
            ratio = statistics.median(b / a for a, b in pairs)
            rows.append(f"| {name} | {n} | {statistics.median(off):.3f} s | "
                        f"{statistics.median(on):.3f} s | {100 * (ratio - 1):+.1f}% |")
    return rows


def _launch_seconds(fn, n: int, report: bool) -> float:
    start = time.perf_counter()
    launch(fn, n, echo=False, desync_report=report)
    return time.perf_counter() - start


def _row(name: str, off: list[float], on: list[float]) -> str:
    ratios = sorted(b / a for a, b in zip(off, on))
    q1, q3 = ratios[len(ratios) // 4], ratios[3 * len(ratios) // 4]
    return (f"| {name} | {statistics.median(off) * 1e3:.3f} ms | "
            f"{statistics.median(on) * 1e3:.3f} ms | {100 * (statistics.median(ratios) - 1):+.1f}% "
            f"({100 * (q1 - 1):+.1f}% .. {100 * (q3 - 1):+.1f}%) |")


def main() -> None:
    measure(False)  # forkserver warm
    pairs = [(measure(False), measure(True)) for _ in range(PAIRS)]
    print(f"2 ranks, {PAIRS} launch pairs x {STEPS} steps, median per step")
    print("| per step | recorder off | recorder on | overhead: median of pair ratios "
          "(quartiles) |\n|---|---|---|---|")
    print(_row("wall time", [off[0] for off, _ in pairs], [on[0] for _, on in pairs]))
    print(_row("main thread CPU", [off[1] for off, _ in pairs], [on[1] for _, on in pairs]))
    step_ms = statistics.median(off[0] for off, _ in pairs) * 1e3
    print("\n".join(per_collective_table(step_ms)))
    print("\n".join(launch_cost_table()))


if __name__ == "__main__":
    main()
