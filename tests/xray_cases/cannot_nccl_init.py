# expect: cannot judge
# first line: Cannot run here: {script}:20 `dist.init_process_group("nccl", rank=rank,
#   world_size=world_size)` needs a GPU
"""The PyTorch DDP tutorial's setup, run by torchrun: the NCCL backend, which needs a GPU
per rank (the launch refuses it on a CPU machine, as NCCL itself would fail there)."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def setup():
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    # initialize the process group
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    return rank


def demo_basic():
    rank = setup()
    device_id = rank % torch.cuda.device_count()
    model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)).to(device_id)
    ddp_model = DDP(model, device_ids=[device_id])
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    for _ in range(5):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        nn.MSELoss()(outputs, torch.randn(20, 5).to(device_id)).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    demo_basic()
