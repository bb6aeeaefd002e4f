# expect: P09
"""Gradient accumulation that puts only the backward inside no_sync(): DDP decides at the
forward whether the next backward all-reduces, so every micro-step still does."""
import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM_STEPS = 4


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(rank)
    for step in range(12):
        x, y = torch.randn(8, 32, generator=gen), torch.randn(8, 1, generator=gen)
        loss = nn.functional.mse_loss(model(x), y) / ACCUM_STEPS
        sync_now = (step + 1) % ACCUM_STEPS == 0
        with contextlib.nullcontext() if sync_now else model.no_sync():
            loss.backward()
        if sync_now:
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
