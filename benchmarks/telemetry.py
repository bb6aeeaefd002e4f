"""Telemetry overhead: training step time on 2 ranks with recording off vs on.

Run:  .venv/bin/python benchmarks/telemetry.py          (about a minute on 2 cores)

"On" records everything the course records: spans, a scalar, gradients before and after
every all-reduce, the all-reduces, BatchNorm statistics and sampler indices. "Off" is the
same code with Recorder(enabled=False). Two small models: a tiny MLP, whose step is so
short that it shows the fixed cost per step, and a small CNN.

Each rank trains two identical DDP models, one recorded and one not, taking their steps
in turn (in alternating order), so a burst of load from other programs hits both alike.
The table shows, per model, the median step time with recording off and on, and the
median of the paired differences (on minus off, step by step); CPU time counts every
thread of the rank's process. Figures are of the slower rank, median over launches.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from course_lib import launch, telemetry

WORLD_SIZE, BATCH, LAUNCHES = 2, 32, 3
# name: (input shape of one sample, warm-up steps, measured steps)
MODELS = {"MLP 64-256-256-10, 2 BatchNorm": ((64,), 20, 300),
          "CNN 2 conv, 2 BatchNorm, 3x32x32": ((3, 32, 32), 5, 60)}
_KEYS = ("wall off", "wall on", "wall diff", "cpu off", "cpu on", "cpu diff")


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name.startswith("MLP"):
        return nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(),
                             nn.Linear(256, 256), nn.BatchNorm1d(256), nn.ReLU(),
                             nn.Linear(256, 10))
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 8 * 8, 10))


class Trainer:
    """One DDP model, its optimizer, its data and its recorder (on or off)."""

    def __init__(self, name: str, record: bool, data: TensorDataset) -> None:
        self.model = DDP(build(name))
        self.rec = telemetry.Recorder(enabled=record)
        self.rec.watch_ddp(self.model)
        self.rec.watch_batchnorm(self.model)
        sampler = self.rec.watch_sampler(DistributedSampler(data, seed=0))
        self.batches = iter(DataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def step(self, step: int) -> tuple[float, float]:
        """Train one step; return its wall-clock and CPU seconds."""
        start, start_cpu = time.perf_counter(), time.process_time()
        rec = self.rec
        with rec.step(step):
            x, y = next(self.batches)
            with rec.span("forward"):
                loss = F.cross_entropy(self.model(x), y)
            with rec.span("backward"):
                loss.backward()
            with rec.span("optimizer"):
                self.opt.step()
                self.opt.zero_grad()
            rec.scalar("loss", loss)
        return time.perf_counter() - start, time.process_time() - start_cpu


def paired_steps(name: str) -> dict[str, list[float]]:
    """Per measured step: wall and CPU seconds off and on, trained in turn."""
    shape, warmup, steps = MODELS[name]
    size = WORLD_SIZE * BATCH * (warmup + steps)
    data = TensorDataset(torch.randn(size, *shape), torch.randint(0, 10, (size,)))
    trainers = {False: Trainer(name, False, data), True: Trainer(name, True, data)}
    out: dict[str, list[float]] = {"wall off": [], "wall on": [], "cpu off": [], "cpu on": []}
    for step in range(warmup + steps):
        order = (False, True) if step % 2 else (True, False)
        times = {record: trainers[record].step(step) for record in order}
        if step >= warmup:
            for record, (wall, cpu) in times.items():
                out[f"wall {'on' if record else 'off'}"].append(wall)
                out[f"cpu {'on' if record else 'off'}"].append(cpu)
    dist.barrier()
    return out


def summary(name: str) -> dict[str, float]:
    """Median ms per step off and on, and median paired difference, of the slower rank."""
    per_launch = []
    for _ in range(LAUNCHES):
        ranks = launch(paired_steps, WORLD_SIZE, args=(name,), echo=False, timeout=300).results
        per_launch.append({key: max(_stat(r, key) for r in ranks) for key in _KEYS})
    return {key: statistics.median(p[key] for p in per_launch) for key in _KEYS}


def _stat(steps: dict[str, list[float]], key: str) -> float:
    kind, what = key.split()
    if what == "diff":
        pairs = zip(steps[f"{kind} on"], steps[f"{kind} off"])
        return statistics.median(on - off for on, off in pairs) * 1e3
    return statistics.median(steps[key]) * 1e3


def main() -> None:
    results = {name: summary(name) for name in MODELS}
    print(f"command: {sys.executable} {' '.join(sys.argv)}")
    print(f"{WORLD_SIZE} ranks, batch {BATCH} per rank, {LAUNCHES} launches per model, torch "
          f"{torch.__version__}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'model':<34} {'':>5} {'off ms':>8} {'on ms':>8} {'on-off (paired)':>21}")
    for name, r in results.items():
        for kind in ("wall", "cpu"):
            off, diff = r[f"{kind} off"], r[f"{kind} diff"]
            print(f"{name:<34} {kind:>5} {off:>8.3f} {r[f'{kind} on']:>8.3f} "
                  f"{diff:>+10.3f} ms {diff / off * 100:>+6.1f}%")


if __name__ == "__main__":
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    main()
