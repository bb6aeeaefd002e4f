# expect: S3
"""A model converted to fp16 with .half() to save memory, trained without loss scaling:
small gradients flush to zero in fp16."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64 * 64))
    nn.init.zeros_(net[2].weight)
    nn.init.zeros_(net[2].bias)
    model = DDP(net.half())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(6):
        x = torch.randn(64, 64, generator=gen).half()
        target = 1e-3 * torch.randn(64, 64 * 64, generator=gen)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x).float(), target)
        loss.backward()
        optimizer.step()
    if rank == 0:
        print(f"loss {loss.item():.3e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
