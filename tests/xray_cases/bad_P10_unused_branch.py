# expect: P10
"""A model with an auxiliary head that the training loss never uses, wrapped in DDP with
the defaults: the second iteration fails."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
        self.head = nn.Linear(64, 4)
        self.aux_head = nn.Linear(64, 1)  # planned for a later experiment

    def forward(self, x):
        return self.head(self.body(x))


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(5):
        x, y = torch.randn(16, 32, generator=gen), torch.randint(0, 4, (16,), generator=gen)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
