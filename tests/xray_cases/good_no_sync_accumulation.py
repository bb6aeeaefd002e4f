# expect: none
# checks: P09
"""Gradient accumulation done right: forward and backward of the first k-1 micro-batches
inside no_sync(), so gradients are all-reduced once per optimizer step."""
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
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    for step in range(16):
        x, y = torch.randn(8, 32, generator=gen), torch.randn(8, 1, generator=gen)
        last_micro_step = (step + 1) % ACCUM_STEPS == 0
        context = contextlib.nullcontext() if last_micro_step else model.no_sync()
        with context:
            loss = nn.functional.mse_loss(model(x), y) / ACCUM_STEPS
            loss.backward()
        if last_micro_step:
            optimizer.step()
            optimizer.zero_grad()
    if rank == 0:
        print(f"final loss {loss.item() * ACCUM_STEPS:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
