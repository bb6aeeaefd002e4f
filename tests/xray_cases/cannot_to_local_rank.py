# expect: cannot judge
# first line: Cannot run here: {script}:28 `model = ToyModel().to(rank)` needs a GPU
"""pytorch/examples distributed/ddp/example.py's demo_basic on gloo: the model goes to
device `rank`, an integer, which means the accelerator (on a CPU machine: RuntimeError:
Cannot access accelerator device when none is available)."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


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


def main():
    dist.init_process_group(backend="gloo")
    demo_basic(int(os.environ["LOCAL_RANK"]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
