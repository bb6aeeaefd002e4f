# expect: none
# xray: --nproc-per-node 3
# checks: P08
"""Data parallel by hand, done right: rank 0's initial weights are broadcast to every rank,
and gradients are averaged with one all_reduce per parameter before each step."""
import os

import torch
import torch.distributed as dist
from torch import nn


def main():
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    torch.manual_seed(1234 + rank)  # different data per rank
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(10):
        x, y = torch.randn(16, 16), torch.randn(16, 1)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world_size
        optimizer.step()
    if rank == 0:
        print(f"first weight {model[0].weight[0, 0].item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
