"""Data parallelism three ways, timed side by side: one all-reduce per parameter after
backward (NaiveDataParallel), flat buckets all-reduced during backward
(BucketedDataParallel), and PyTorch's DistributedDataParallel (course_lib.teach.data_parallel).

Run:  .venv/bin/python benchmarks/data_parallel.py [--world-size 2] [--layers 16]
      [--width 256] [--steps 30] [--bucket-mb 1] [--backend gloo]
Each rank trains an MLP of `layers` Linear(width, width) layers (2 x layers parameter
tensors) on its own batch of 32; the table shows the median time of a training step
(forward, backward, gradient sync, SGD step) over `steps` steps after 3 warm-up steps, per
way, and the number of all-reduce calls each way makes in one step. The bucketed way and
DDP use buckets of `bucket_mb` MiB (default 1: a few buckets for the default model, so
that communication can overlap backward; DDP's own default is 25). On a shared CPU the
times move with the machine's load: compare rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from course_lib import launch, rank_device
from course_lib.checks.collectives import count, recorded
from course_lib.teach.data_parallel import WRAPPERS, finish_gradient_sync

WARM_UP = 3


def mlp(layers: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width),
                                                                nn.ReLU())])


def time_each_way(layers: int, width: int, steps: int,
                  bucket_mb: float) -> dict[str, tuple[float, int]]:
    """On every rank: {way: (median step seconds, all-reduce calls in one step)}."""
    device = rank_device()
    torch.manual_seed(dist.get_rank())
    x = torch.randn(32, width, device=device)
    out = {}
    for name, wrap in WRAPPERS.items():
        options = {} if name == "naive" else {"bucket_cap_mb": bucket_mb}
        model = wrap(mlp(layers, width).to(device), **options)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        times, calls = [], 0
        for step in range(WARM_UP + steps):
            dist.barrier()  # every rank starts the step together
            start = time.perf_counter()
            opt.zero_grad()
            with recorded() as seen:
                model(x).square().mean().backward()
                finish_gradient_sync(model)
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if step >= WARM_UP:
                times.append(time.perf_counter() - start)
            calls = count(seen, "all_reduce")
        out[name] = (statistics.median(times), calls)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--bucket-mb", type=float, default=1.0)
    parser.add_argument("--backend", default="gloo", help="gloo (default), nccl or auto")
    args = parser.parse_args()
    run = launch(time_each_way, args.world_size, args=(args.layers, args.width, args.steps,
                                                args.bucket_mb),
                 backend=args.backend, timeout=600, echo=False)
    per_rank = run.results
    print(f"{args.world_size} ranks ({run.backend}), {args.layers} x Linear({args.width}, "
          f"{args.width}), batch 32 per rank, buckets of {args.bucket_mb:g} MiB, median of "
          f"{args.steps} steps, slowest rank:")
    print(f"{'way':<10} {'step ms':>9} {'all-reduce calls / step':>25}")
    for name in WRAPPERS:
        slowest = max(r[name][0] for r in per_rank)
        calls = per_rank[0][name][1]
        # DDP's reducer calls the process group from C++, past torch.distributed's Python
        # functions that recorded() watches: it counts 0 there
        note = " (DDP's run in C++, not counted)" if name == "ddp" and not calls else ""
        print(f"{name:<10} {1000 * slowest:>9.1f} {calls:>25}{note}")


if __name__ == "__main__":
    main()
