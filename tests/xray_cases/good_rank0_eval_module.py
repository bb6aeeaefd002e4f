# expect: none
# checks: S1 X3
"""Rank 0 evaluates the unwrapped model (model.module) under no_grad: no collective, no hang."""

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
    for epoch in range(2):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if rank == 0:
            model.module.eval()
            with torch.no_grad():
                val = nn.functional.mse_loss(model.module(x), y)
            model.module.train()
            print(f"epoch {epoch} val loss {val.item():.3f}")
        dist.barrier()


if __name__ == "__main__":
    main()
