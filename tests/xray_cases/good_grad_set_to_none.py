# expect: none
"""No accumulation: gradients cleared by setting them to None (an old speed tip) instead of
zero_grad(), one forward and backward per optimizer step."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(8):
        x, y = torch.randn(8, 32, generator=gen), torch.randn(8, 1, generator=gen)
        for p in model.parameters():
            p.grad = None
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
