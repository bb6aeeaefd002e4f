"""The training function of lesson 14's exercise, which the learner's main() makes
torchrun-ready, and its true result: the same training in one process on the whole batches.

`train` is what a notebook imports (`from course_lib.checks.lesson14 import train`); with
COURSE_CHECK14_RAISE set it raises `InjectedFailure` instead, so that the check can see
whether main() still leaves the process group when training fails.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

BATCH = 12  # the global batch of a step, split evenly over 2 or 3 ranks
STEPS = 4
RAISE = "COURSE_CHECK14_RAISE"  # set: train() raises InjectedFailure once the group exists


class InjectedFailure(RuntimeError):
    """The error the check makes train() raise, to see whether main() still leaves the group."""


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one step (every rank, and the one-process reference, builds it)."""
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def train(out_dir: str, steps: int = STEPS) -> dict[str, torch.Tensor]:
    """DDP training on this rank's share of each batch; rank 0 saves out_dir/final.pt.
    With COURSE_CHECK14_RAISE set, it raises InjectedFailure instead (the group exists)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if os.environ.get(RAISE):
        raise InjectedFailure("train() failed (the check made it raise)")
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = batch(step)
        loss = F.mse_loss(model(x[rank::world_size]), y[rank::world_size])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    weights = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    if rank == 0:
        torch.save(weights, os.path.join(out_dir, "final.pt"))
    return weights


def one_process(steps: int = STEPS) -> dict[str, torch.Tensor]:
    """The true result: the same training in one process on the whole batch of each step
    (DDP's average of equal shards' mean losses is the whole batch's mean loss)."""
    with torch.random.fork_rng(devices=[]):  # the CPU's only: no CUDA in the kernel
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = batch(step)
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
