# expect: none
"""fp16 autocast with a GradScaler and gradient clipping done in the right order
(unscale_ before clip), with gradient accumulation under no_sync()."""
import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM_STEPS = 2


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    gen = torch.Generator().manual_seed(rank)
    for step in range(8):
        x, y = torch.randn(16, 32, generator=gen), torch.randint(0, 4, (16,), generator=gen)
        boundary = (step + 1) % ACCUM_STEPS == 0
        with contextlib.nullcontext() if boundary else model.no_sync():
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x), y) / ACCUM_STEPS
            scaler.scale(loss).backward()
        if boundary:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
