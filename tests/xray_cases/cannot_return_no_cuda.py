# expect: cannot judge
# first line: The script ended before training: every rank returned without a DDP forward, an
#   optimizer step, a DataLoader batch or a collective, after printing 'This example needs CUDA;
#   exiting.' ({script}:22); it asked for GPUs and torch.cuda.is_available() was False here
#   ({script}:20)
"""A training main() that returns early when there is no GPU (no exception, no exit status:
on a CPU machine every rank simply ends)."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    if not torch.cuda.is_available():
        if local_rank == 0:
            print("This example needs CUDA; exiting.")
        return
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    sampler = DistributedSampler(data)
    model = DDP(nn.Linear(16, 1).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=32, sampler=sampler):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward()
            optimizer.step()


if __name__ == "__main__":
    main()
