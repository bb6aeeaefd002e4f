# expect: S1
"""Rank 0 takes one more training step than the others (its own stopping rule); the model
has BatchNorm, so the extra step first waits in DDP's buffer broadcast: not an evaluation,
so S1 and not X3."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    steps = 4 if rank == 0 else 3  # a per-rank stopping rule
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    dist.barrier()


if __name__ == "__main__":
    main()
