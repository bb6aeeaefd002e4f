# expect: cannot judge
# first line: Cannot run here: init_process_group(world_size=0) at {script}:19 asks for a job of no
#   process; torch.cuda.device_count() returned 0 on this machine just before (at {script}:18)
"""A torchrun script that counts the GPUs for its world size ("one process per GPU"): on a
CPU machine that is 0."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    rank = int(os.environ["RANK"])
    world_size = torch.cuda.device_count()
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    data = TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank)
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(data, batch_size=16, sampler=sampler):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


if __name__ == "__main__":
    main()
