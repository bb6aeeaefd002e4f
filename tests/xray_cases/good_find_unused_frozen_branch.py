# expect: none
"""A model with a branch the loss never uses, wrapped with find_unused_parameters=True:
DDP marks the branch ready in every step instead of waiting for its gradients."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
        self.classifier = nn.Linear(64, 4)
        self.decoder = nn.Linear(64, 32)  # used by the pre-training script only

    def forward(self, x):
        return self.classifier(self.encoder(x))


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(Net(), find_unused_parameters=True)
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
