# expect: cannot judge
# first line: The script exited before training: sys.exit() ended it at {script}:61 on every rank,
#   after printing 'Unable to locate sufficient 2 gpus to run this example. Exiting.' ({script}:60);
#   it asked for GPUs and torch.accelerator.is_available() was False here ({script}:20)
"""pytorch/examples distributed/ddp/example.py, shortened: it checks for two GPUs first and
exits without them (sys.exit() is a normal end of the process, status 0)."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def verify_min_gpu_count(min_gpus: int = 2) -> bool:
    """ verification that we have at least 2 gpus to run dist examples """
    has_gpu = torch.accelerator.is_available()
    gpu_count = torch.accelerator.device_count()
    return has_gpu and gpu_count >= min_gpus


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank):
    model = ToyModel().to(rank)
    ddp_model = DDP(model, device_ids=[rank])
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    nn.MSELoss()(outputs, torch.randn(20, 5).to(rank)).backward()
    optimizer.step()
    print(f"training completed in rank {rank}!")


def main():
    rank = int(os.environ["RANK"])
    acc = torch.accelerator.current_accelerator()
    backend = torch.distributed.get_default_backend_for_device(acc)
    torch.accelerator.set_device_index(rank)
    dist.init_process_group(backend=backend)
    demo_basic(rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    _min_gpu_count = 2
    if not verify_min_gpu_count(min_gpus=_min_gpu_count):
        print(f"Unable to locate sufficient {_min_gpu_count} gpus to run this example. Exiting.")
        sys.exit()
    main()
