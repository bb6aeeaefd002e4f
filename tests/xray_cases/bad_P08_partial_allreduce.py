# expect: P08
"""Data parallel by hand with the same seed on every rank, but the sync loop averages the
backbone's gradients only: the head added later trains on each rank's own data."""
import os

import torch
import torch.distributed as dist
from torch import nn


def main():
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
    head = nn.Linear(32, 3)
    params = list(backbone.parameters()) + list(head.parameters())
    optimizer = torch.optim.SGD(params, lr=0.1)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(6):
        x, y = torch.randn(16, 16, generator=gen), torch.randint(0, 3, (16,), generator=gen)
        optimizer.zero_grad()
        nn.functional.cross_entropy(head(backbone(x)), y).backward()
        for p in backbone.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        optimizer.step()
    if dist.get_rank() == 0:
        print(f"head bias {head.bias.tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
