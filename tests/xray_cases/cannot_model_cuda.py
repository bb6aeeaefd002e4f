# expect: cannot judge
# first line: Cannot run here: {script}:32 `model = Net().cuda(local_rank)` needs a GPU
"""A torchrun script written for one GPU per process: the model goes to the GPU with
.cuda(local_rank), the process group is gloo (on a CPU-only torch: AssertionError: Torch
not compiled with CUDA enabled)."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    dist.init_process_group("gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    data = TensorDataset(torch.randn(512, 1, 28, 28), torch.randint(0, 10, (512,)))
    sampler = DistributedSampler(data)
    model = Net().cuda(local_rank)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=64, sampler=sampler):
            x, y = x.cuda(local_rank), y.cuda(local_rank)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
