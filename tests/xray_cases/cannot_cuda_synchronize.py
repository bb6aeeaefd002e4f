# expect: cannot judge
# first line: Cannot run here: {script}:18 `torch.cuda.synchronize()` needs a GPU
"""A training loop timed per epoch the GPU way: torch.cuda.synchronize() before reading the
clock. The first epoch trains on the CPU; the first synchronize fails (on a CPU-only torch:
AssertionError: Torch not compiled with CUDA enabled)."""

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def epoch_seconds(start):
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main():
    dist.init_process_group("gloo")
    data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    sampler = DistributedSampler(data)
    model = DDP(nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        for x, y in DataLoader(data, batch_size=32, sampler=sampler):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        seconds = epoch_seconds(start)
        if int(os.environ["RANK"]) == 0:
            print(f"epoch {epoch}: {seconds:.2f} s")


if __name__ == "__main__":
    main()
